"""The sweep that chose the CPU default (settings.LAPTOP): candidates for `python train_gpt2.py` without a
GPU, each given as the flags that change the default, run by dev/laptop_vs_nanogpt.py in turns with nanoGPT's
laptop recipe and scored on the same held-out bytes. docs/compare.md has its table and why the default is
what it is. Measure on an idle machine.

    python dev/cpu_sweep.py --peer ../shared/peers/nanogpt                      # each once: ~25 minutes
    python dev/cpu_sweep.py --peer ../shared/peers/nanogpt --pairs 3 --only "4 x 64" "4 x 96"

Where a CPU's time goes guided it: the 50,304-wide head (its matmuls, and the softmax over its logits) is
most of a step, so the time grows with the tokens and the width, and barely with the depth.
"""
import argparse
import os
import subprocess
import sys

# label: the flags that change the default (the modern recipe, 4 x 64, T=128, 2,048 tokens a step, 150 steps)
CANDIDATES = {
    "4 x 64": "",  # the default
    "4 x 80": "--n_embd=80",
    "4 x 96": "--n_embd=96",
    "6 x 96": "--n_layer=6 --n_embd=96",
    "8 x 128": "--n_layer=8 --n_embd=128",
    "4 x 96, 130 steps": "--n_embd=96 --max_steps=130",
    "4 x 128, 110 steps": "--n_embd=128 --max_steps=110",
    "8 x 64, T=256": "--n_layer=8 --T=256",
    "8 x 64, T=256, 200 steps": "--n_layer=8 --T=256 --max_steps=200",
    "4 x 64, T=256, 200 steps": "--T=256 --max_steps=200",
    "4 x 64, muon_lr 0.04": "--muon_lr=0.04",
    "4 x 64, muon_lr 0.01": "--muon_lr=0.01",
    "4 x 64, tied head": "--untied_head=False",
    "GPT-2's recipe (the default until 2026-11-28)": "--recipe=gpt2 --max_lr=3e-3",
}


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--peer", required=True,
                        help="nanoGPT's folder, as dev/laptop_vs_nanogpt.py's --peer")
    parser.add_argument("--pairs", type=int, default=1, help="rounds in turns (default: %(default)s)")
    parser.add_argument("--only", nargs="+", choices=CANDIDATES, default=list(CANDIDATES),
                        help="the candidates to run, by label (default: all)")
    args = parser.parse_args()
    tool = os.path.join(os.path.dirname(os.path.abspath(__file__)), "laptop_vs_nanogpt.py")
    cmd = [sys.executable, tool, "--peer", args.peer, "--pairs", str(args.pairs)]
    cmd += [f"--ours={CANDIDATES[label]}" for label in args.only]
    raise SystemExit(subprocess.run(cmd).returncode)


if __name__ == "__main__":
    main()
