"""HellaSwag's cost: hellaswag.evaluate (batched) or the one-example-per-forward reference on real examples,
at the GPT-2 124M shape (random weights: the cost does not depend on them), in examples/s; --check compares
the predictions of the two on every example given, in float64 on a small model (no near-ties from rounding).

    python dev/bench_hellaswag.py hellaswag_val.jsonl --n 48                # evaluate, 16 examples a forward
    python dev/bench_hellaswag.py hellaswag_val.jsonl --n 48 --unbatched    # the reference
    python dev/bench_hellaswag.py hellaswag_val.jsonl --check               # all 10,042: same predictions?
"""
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import hellaswag  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402
from runtime import Runtime  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("data", help="hellaswag_val.jsonl")
    parser.add_argument("--n", type=int, default=None, help="the first N examples (default: all)")
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--unbatched", action="store_true", help="time the one-example reference instead")
    parser.add_argument("--check", action="store_true", help="compare predictions instead of timing")
    args = parser.parse_args()
    examples = hellaswag.load_examples(args.data, args.n)
    torch.manual_seed(0)
    if args.check:
        model = GPT(GPTConfig(vocab_size=50304, n_layer=2, n_head=4, n_embd=128)).double().eval()
        t0 = time.time()
        got = hellaswag.evaluate(model, examples, Runtime(), args.batch_size)
        ref = hellaswag.evaluate_unbatched(model, examples, Runtime())
        same = sum(a == b for a, b in zip(got["predictions"], ref["predictions"]))
        print(f"{same} of {len(examples)} predictions identical; acc {got['acc']:.4f} / {ref['acc']:.4f}, "
              f"acc_norm {got['acc_norm']:.4f} / {ref['acc_norm']:.4f} ({time.time() - t0:.0f} s)")
        sys.exit(0 if same == len(examples) else 1)
    model = GPT(GPTConfig(vocab_size=50304)).eval()  # GPT-2 124M
    t0 = time.time()
    if args.unbatched:
        result = hellaswag.evaluate_unbatched(model, examples, Runtime())
    else:
        result = hellaswag.evaluate(model, examples, Runtime(), args.batch_size)
    dt = time.time() - t0
    print(f"{'unbatched' if args.unbatched else 'evaluate'}: {len(examples)} examples in {dt:.1f} s, "
          f"{len(examples) / dt:.2f} examples/s, acc {result['acc']:.4f}, acc_norm {result['acc_norm']:.4f}")


if __name__ == "__main__":
    main()
