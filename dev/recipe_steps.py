"""How many steps --recipe=modern needs to reach GPT-2's loss, on the CPU default of 2026-11-27 (GPT-2's
recipe, 4 layers, 64 wide, input.txt; EARLIER): each configuration trains a full schedule (warmup and cosine)
of N steps, and N is searched for the smallest that reaches the validation loss GPT-2's recipe (AdamW) has
after 150 steps. Then each change of the modern recipe is turned off alone, at the modern recipe's N. Two
runs at a time, one thread each.

    python dev/recipe_steps.py                      # seeds 1337 and 42, ~45 min on 2 cores
    python dev/recipe_steps.py --seeds 1337 --no-ablation
"""
import argparse
import concurrent.futures
import functools
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from gptlib.settings import RECIPES  # noqa: E402

BASELINE_STEPS = 150  # the CPU default's schedule
# the CPU default's settings that dev/cpu_sweep.py changed since (its recipe: named in CONFIGS), which this
# measured on: docs/model.md's table
EARLIER = ("--B=8", "--val_tokens=8192")
GPT2 = ("GPT-2, AdamW (the CPU default until 2026-11-28)", ("--recipe=gpt2", "--max_lr=3e-3"))  # the target's
CONFIGS = {  # name: train_gpt2.py settings
    "GPT-2, Muon": GPT2[1] + ("--optimizer=muon",),
    "--recipe=modern": ("--recipe=modern",),
}
# the ablation: the modern recipe without one change (its settings' GPT-2 values)
WITHOUT = {name: (f"--{name}=False",) for name, on in RECIPES["modern"].items() if on is True}
WITHOUT |= {"Muon (AdamW at 3e-3 for the matrices)": ("--optimizer=adamw", "--max_lr=3e-3")}
WITHOUT |= {f"{name} (max_lr's)": (f"--{name}=0",) for name in ("embed_lr", "head_lr")}


@functools.cache  # the search and the table ask for some runs twice
def val_loss(args, steps, seed):
    """The validation loss after a full schedule of `steps` steps with settings args (a tuple)."""
    with tempfile.TemporaryDirectory() as log_dir:
        warmup = max(1, round(steps * 20 / BASELINE_STEPS))  # the CPU default's 20 of 150
        cmd = [sys.executable, os.path.join(ROOT, "train_gpt2.py"), f"--max_steps={steps}",
               f"--warmup_steps={warmup}", f"--eval_interval={steps}", f"--checkpoint_interval={steps}",
               f"--seed={seed}", f"--log_dir={log_dir}", *EARLIER, *args]
        env = dict(os.environ, OMP_NUM_THREADS="1")
        done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
        with open(os.path.join(log_dir, "metrics.jsonl")) as f:
            return [r["val_loss"] for r in map(json.loads, f) if "val_loss" in r][-1]


def steps_to(args, target, seed, low=10, high=BASELINE_STEPS, grain=5):
    """The fewest steps (a multiple of grain) whose full schedule reaches target, by bisection (the final
    loss falls as the schedule lengthens); None if even `high` does not."""
    if val_loss(args, high, seed) > target:
        return None
    while high - low > grain:
        mid = (low + high) // 2 // grain * grain
        low, high = (low, mid) if val_loss(args, mid, seed) <= target else (mid, high)
    return high


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, nargs="+", default=[1337, 42])
    parser.add_argument("--no-ablation", action="store_true")
    opts = parser.parse_args()
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        targets = dict(zip(opts.seeds, pool.map(lambda s: val_loss(GPT2[1], BASELINE_STEPS, s), opts.seeds)))
        print(f"target: GPT-2's val loss after {BASELINE_STEPS} steps: "
              + ", ".join(f"{v:.4f} (seed {s})" for s, v in targets.items()), flush=True)
        jobs = {(name, s): pool.submit(steps_to, args, targets[s], s)
                for name, args in CONFIGS.items() for s in opts.seeds}
        print(f"\n| configuration | val loss at {BASELINE_STEPS} | steps to reach it |\n"
              f"| --- | ---: | ---: |")
        print(f"| {GPT2[0]} | " + " / ".join(f"{targets[s]:.2f}" for s in opts.seeds)
              + f" | {BASELINE_STEPS} |")
        for name, args in CONFIGS.items():
            steps = " / ".join(str(jobs[name, s].result()) for s in opts.seeds)  # (runs at 150 first)
            losses = " / ".join(f"{val_loss(args, BASELINE_STEPS, s):.2f}" for s in opts.seeds)
            print(f"| {name} | {losses} | {steps} |", flush=True)
        if opts.no_ablation:
            return
        modern = CONFIGS["--recipe=modern"]
        n = {s: jobs["--recipe=modern", s].result() or BASELINE_STEPS for s in opts.seeds}
        changes = {(name, s): pool.submit(val_loss, modern + args, n[s], s)
                   for name, args in WITHOUT.items() for s in opts.seeds}
        base = " / ".join(f"seed {s}: {n[s]} steps, {val_loss(modern, n[s], s):.4f}" for s in n)
        print(f"\nthe modern recipe without one change, at its own steps (val loss minus the modern "
              f"recipe's; {base})\n| without | change |\n| --- | ---: |")
        for name in WITHOUT:
            print(f"| {name} | " + " / ".join(f"{changes[name, s].result() - val_loss(modern, n[s], s):+.2f}"
                                               for s in opts.seeds) + " |", flush=True)


if __name__ == "__main__":
    main()
