"""HellaSwag's cost: hellaswag.evaluate (packed, batched) or the one-example-per-forward reference on real
examples, at the GPT-2 124M shape (random weights: the cost does not depend on them), on the device
runtime.setup picks (bf16 on a GPU); --check compares the predictions of the two on every example given, in
float64 on a small CPU model (no near-ties from rounding).

    python dev/bench_hellaswag.py hellaswag_val.jsonl --n 48                # evaluate, 16 examples a forward
    python dev/bench_hellaswag.py hellaswag_val.jsonl --n 48 --unbatched    # the reference
    python dev/bench_hellaswag.py hellaswag_val.jsonl --batch_size 64 --repeat 3   # on a GPU: cold, then warm
    python dev/bench_hellaswag.py hellaswag_val.jsonl --check               # all 10,042: same predictions?

Packed, it times tokenizing and packing (hellaswag.prepare, once per run) apart from each evaluation;
--no_cudnn keeps SDPA off cuDNN's attention (which builds a plan for each new shape) for an A/B.
"""
import argparse
import contextlib
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from gptlib import runtime  # noqa: E402
import hellaswag  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("data", help="hellaswag_val.jsonl")
    parser.add_argument("--n", type=int, default=None, help="the first N examples (default: all)")
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=1, help="evaluations of the same prepared batches")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--no_cudnn", action="store_true", help="SDPA without cuDNN's attention")
    parser.add_argument("--unbatched", action="store_true", help="time the one-example reference instead")
    parser.add_argument("--check", action="store_true", help="compare predictions instead of timing")
    args = parser.parse_args()
    examples = hellaswag.load_examples(args.data, args.n)
    torch.manual_seed(0)
    if args.check:
        model = GPT(GPTConfig(vocab_size=50304, n_layer=2, n_head=4, n_embd=128)).double().eval()
        t0 = time.time()
        prepared = hellaswag.prepare(examples, runtime.Runtime(), args.batch_size, model.config.block_size)
        got = hellaswag.evaluate(model, prepared, runtime.Runtime())
        ref = hellaswag.evaluate_unbatched(model, examples, runtime.Runtime())
        same = sum(a == b for a, b in zip(got["predictions"], ref["predictions"]))
        print(f"{same} of {len(examples)} predictions identical; acc {got['acc']:.4f} / {ref['acc']:.4f}, "
              f"acc_norm {got['acc_norm']:.4f} / {ref['acc_norm']:.4f} ({time.time() - t0:.0f} s)")
        sys.exit(0 if same == len(examples) else 1)
    rt = runtime.setup(args.device)
    model = GPT(GPTConfig(vocab_size=50304)).to(rt.device).eval()  # GPT-2 124M
    attention = contextlib.nullcontext()
    if args.no_cudnn:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        attention = sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])
    if args.unbatched:
        t0 = time.time()
        result = hellaswag.evaluate_unbatched(model, examples, rt)
        dt = time.time() - t0
        print(f"unbatched: {len(examples)} examples in {dt:.1f} s, {len(examples) / dt:.2f} examples/s, "
              f"acc {result['acc']:.4f}, acc_norm {result['acc_norm']:.4f}")
        return
    t0 = time.time()  # what any first GPU work in a process pays (libraries, kernels loaded): apart
    with torch.no_grad(), runtime.autocast(rt.device, rt.dtype):
        model(torch.zeros(1, 8, dtype=torch.long, device=rt.device))
    runtime.synchronize(rt.device)
    print(f"first forward in this process: {time.time() - t0:.2f} s")
    t0 = time.time()
    prepared = hellaswag.prepare(examples, rt, args.batch_size, model.config.block_size)
    shapes = sorted({tuple(shapes[0]) for _, shapes, _ in prepared.batches})
    print(f"prepared {len(examples)} examples in {time.time() - t0:.2f} s: {len(prepared.batches)} batches, "
          f"shapes {shapes}")
    with attention:
        for i in range(args.repeat):
            runtime.synchronize(rt.device)
            t0 = time.time()
            result = hellaswag.evaluate(model, prepared, rt)
            dt = time.time() - t0
            print(f"evaluate {i + 1}: {len(examples)} examples in {dt:.2f} s, {len(examples) / dt:.1f} "
                  f"examples/s, acc {result['acc']:.4f}, acc_norm {result['acc_norm']:.4f} ({rt.device}, "
                  f"{rt.dtype}{', no cuDNN attention' if args.no_cudnn else ''})")


if __name__ == "__main__":
    main()
