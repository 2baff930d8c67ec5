"""CORE's tokenizing and packing (core_eval.Prepared), timed side by side in one process: each few-shot example
encoded once per task (core_eval.tokens, what core_eval.py does) against every prompt encoded whole (as
db9da80 did), alternating; the packed batches are checked equal.

    python dev/make_core_bundle.py hellaswag_val.jsonl core_bench --n 2000
    python dev/bench_core_tokenize.py core_bench --repeats 3
"""
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import core_eval  # noqa: E402
from runtime import Runtime  # noqa: E402

PIECEWISE = core_eval.tokens


def whole(text, cuts, enc, cache):
    """Every prompt encoded whole: the cuts unused."""
    return enc.encode_ordinary(text)


def prepare(tasks, way):
    core_eval.tokens = way
    t0 = time.perf_counter()
    prepared = core_eval.Prepared(tasks, Runtime(), 16, 1024)
    return time.perf_counter() - t0, prepared


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("bundle")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    tasks = core_eval.load_tasks(args.bundle)
    print(f"{sum(len(t.examples) for t in tasks):,} examples in {len(tasks)} tasks "
          f"({', '.join(f'{t.label}: {t.shots}-shot' for t in tasks)})")
    times = {"whole": [], "each few-shot example once": []}
    for _ in range(args.repeats):
        for name, way in (("whole", whole), ("each few-shot example once", PIECEWISE)):
            dt, prepared = prepare(tasks, way)
            times[name].append(dt)
            if name == "whole":
                reference = prepared.packed.data
            else:
                assert torch.equal(prepared.packed.data, reference), "the packed batches differ"
    for name, ts in times.items():
        print(f"{name}: median {sorted(ts)[len(ts) // 2]:.2f} s ({', '.join(f'{t:.2f}' for t in ts)})")
    a, b = (sorted(ts)[len(ts) // 2] for ts in times.values())
    print(f"ratio {a / b:.2f}x; packed batches equal")


if __name__ == "__main__":
    main()
