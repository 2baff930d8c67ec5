"""A stand-in for llm.c's PyTorch reference (its train_gpt2.py, which this project does not hold) as
bench.py's peer comparison runs it on a CPU (tests/test_bench.py): it takes the flags bench.py passes and
refuses a value it does not act on as llm.c would, reads the shards --input_bin globs (llm.c's .bin layout,
from the folder it runs in) a micro-batch at a time, gets its tokenizer through tiktoken.get_encoding("gpt2")
as llm.c does, and prints what bench.py reads: a line a step in llm.c's format, then the average and the peak
CUDA memory, which off CUDA is 0 MiB. Its first step takes 0.5 s (where llm.c compiles), the others 20 ms."""
import argparse
import glob
import math
import time

import numpy as np
import tiktoken

FLAGS = {"input_bin": str, "model": str, "batch_size": int, "sequence_length": int, "total_batch_size": int,
         "num_iterations": int, "learning_rate": float, "warmup_iters": int, "weight_decay": float,
         "overfit_single_batch": int, "write_tensors": int, "val_loss_every": int, "sample_every": int,
         "device": str, "compile": int, "flash": int, "tensorcores": int, "dtype": str}
parser = argparse.ArgumentParser()
for flag, kind in FLAGS.items():
    parser.add_argument(f"--{flag}", type=kind, required=True)  # bench.py names every one
args = parser.parse_args()
# what this stand-in does not do as llm.c would: bench.py never asks for it
expected = {"model": "d12", "overfit_single_batch": 0, "write_tensors": 0, "val_loss_every": 0,
            "sample_every": 0, "device": "cpu", "compile": 0, "dtype": "float32"}
for flag, value in expected.items():
    assert getattr(args, flag) == value, f"--{flag}={getattr(args, flag)}: the stand-in runs only {value}"
B, T = args.batch_size, args.sequence_length
assert args.total_batch_size % (B * T) == 0, "total_batch_size must be whole micro-batches of B x T"
accumulation = args.total_batch_size // (B * T)

enc = tiktoken.get_encoding("gpt2")  # bench.py's runner makes it the vendored one: no network needed
shards = sorted(glob.glob(args.input_bin))
assert shards, f"did not find any files that match the pattern {args.input_bin}"


def tokens(path):
    header = np.fromfile(path, dtype=np.int32, count=256)
    assert header[0] == 20240520 and header[1] == 1, f"{path}: not a .bin shard of llm.c's layout"
    data = np.fromfile(path, dtype=np.uint16, offset=256 * 4)
    assert len(data) == header[2] and len(data) >= B * T + 1 and data.max() < enc.n_vocab, path
    return data


shard, position, data, timings = 0, 0, tokens(shards[0]), []
for step in range(args.num_iterations):
    t0 = time.time()
    for _ in range(accumulation):  # a micro-batch of B x T inputs and their targets, one token on
        if position + B * T + 1 > len(data):
            shard, position = (shard + 1) % len(shards), 0
            data = tokens(shards[shard])
        assert len(data[position:position + B * T + 1]) == B * T + 1
        position += B * T
    time.sleep(0.5 if step == 0 else 0.02)
    dt = time.time() - t0
    timings.append(dt)
    lr = args.learning_rate * min(1.0, (step + 1) / args.warmup_iters)  # the warm-up; no decay
    print(f"step {step + 1:4d}/{args.num_iterations} | train loss {math.log(enc.n_vocab):.6f} | norm 1.0000 "
          f"| lr {lr:.2e} | ({dt * 1000:.2f} ms | {accumulation * B * T / dt:.0f} tok/s)", flush=True)
print(f"final {len(timings) - 1} iters avg: {np.mean(timings[1:] or timings) * 1000:.3f}ms")
print("peak memory consumption: 0 MiB")  # llm.c's torch.cuda.max_memory_allocated() on a CPU
