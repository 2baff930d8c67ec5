"""CORE's tokenizing and packing (core_eval.Prepared) in this checkout against another checkout of the
project, side by side: each tree's Prepared in a process of its own, alternating, on the same bundle, with
the same threads; reading the bundle is not timed. Each run's wall time and its CPU time (all its threads:
steadier than the wall on a shared machine) are reported. The packed batches of the two are checked equal.

    git worktree add /tmp/base db9da80
    python dev/make_core_bundle.py hellaswag_val.jsonl core_bench        # 31,351 examples
    python dev/bench_core_tokenize.py core_bench --against /tmp/base --repeats 3
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHILD = """
import sys, time, torch
sys.path.insert(0, ".")
import core_eval
from gptlib.runtime import Runtime
tasks = core_eval.load_tasks(sys.argv[1])
rt = Runtime()
rt.cpus = int(sys.argv[3])  # a tree older than Runtime.cpus ignores it
t0, c0 = time.perf_counter(), time.process_time()
prepared = core_eval.Prepared(tasks, rt, 16, 1024)
print(time.perf_counter() - t0, time.process_time() - c0)
torch.save(prepared.packed.data, sys.argv[2])
"""


def prepare(tree, bundle, out, cpus):
    """(seconds, CPU seconds of all its threads) of core_eval.Prepared in tree, its packed data into out."""
    run = subprocess.run([sys.executable, "-c", CHILD, os.path.abspath(bundle), out, str(cpus)], cwd=tree,
                         capture_output=True, text=True)
    if run.returncode:
        sys.exit(f"{tree}: {run.stderr[-2000:]}")
    return tuple(map(float, run.stdout.split()[-2:]))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("bundle", help="a bundle folder (dev/make_core_bundle.py)")
    parser.add_argument("--against", required=True, help="the other checkout (git worktree add DIR COMMIT)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cpus", type=int, default=len(os.sched_getaffinity(0)),
                        help="threads for encoding (default: the cores this process may use)")
    args = parser.parse_args()
    trees = {"this tree": ROOT, args.against: os.path.abspath(args.against)}
    times = {name: [] for name in trees}
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(args.repeats):
            for t, (name, tree) in enumerate(trees.items()):
                times[name].append(prepare(tree, args.bundle, os.path.join(tmp, f"{t}.pt"), args.cpus))
                print(f"{name}: {times[name][-1][0]:.2f} s ({times[name][-1][1]:.2f} s of CPU)", flush=True)
        same = torch.equal(*(torch.load(os.path.join(tmp, f"{t}.pt")) for t in range(2)))
    for name, ts in times.items():
        print(f"{name}: median {statistics.median(t for t, _ in ts):.2f} s "
              f"({', '.join(f'{t:.2f}' for t, _ in ts)}); CPU {statistics.median(c for _, c in ts):.2f} s")
    (mine, theirs), (mine_cpu, theirs_cpu) = ([statistics.median(x[k] for x in ts) for ts in times.values()]
                                              for k in (0, 1))
    print(f"ratio {theirs / mine:.2f}x (CPU time {theirs_cpu / mine_cpu:.2f}x); packed batches "
          f"{'equal' if same else 'DIFFERENT'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
