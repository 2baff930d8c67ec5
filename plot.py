"""Plot a training run from its log: loss (train, validation) and HellaSwag acc_norm against step.

    python plot.py                                          # log/metrics.jsonl -> log/plot.png
    python plot.py --log run/metrics.jsonl --out run.png --logy --gpt2_val_loss 3.2924

Works on a resumed run (the log is appended; a step done twice keeps its last values) and on a run still
writing its log (a half-written last line is skipped).
"""
import argparse
import json
import os

GPT2_HELLASWAG, GPT3_HELLASWAG = 0.2955, 0.337  # OpenAI GPT-2 124M; GPT-3 124M (paper)


def load_metrics(path):
    """{"loss": {step: v}, "val_loss": {step: v}, "hellaswag": {step: v}} from a metrics.jsonl."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"training log {path} does not exist (train_gpt2.py writes LOG_DIR/metrics.jsonl)")
    series = {"loss": {}, "val_loss": {}, "hellaswag": {}}
    with open(path) as f:
        lines = f.read().split("\n")
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines) - 1:  # the line being written by a live run
                continue
            raise ValueError(f"{path}:{i + 1}: not valid JSON; is this a train_gpt2.py metrics.jsonl?") from None
        if "event" in record:
            continue
        for key in series:
            if key in record:
                series[key][record["step"]] = record[key]
    if not any(series.values()):
        raise ValueError(f"{path} holds no loss or evaluation records yet")
    return series


def plot(series, out, logy=False, gpt2_val_loss=None):
    import matplotlib
    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(14, 5))
    for key, label, style in (("loss", "train loss", dict(alpha=0.6, lw=1)), ("val_loss", "val loss", dict(marker="o"))):
        if series[key]:
            steps = sorted(series[key])
            ax1.plot(steps, [series[key][s] for s in steps], label=label, **style)
    if gpt2_val_loss is not None:
        ax1.axhline(gpt2_val_loss, color="r", ls="--", label=f"OpenAI GPT-2 124M val loss ({gpt2_val_loss})")
    if logy:
        ax1.set_yscale("log")
    ax1.set(xlabel="step", ylabel="loss", title="loss")
    ax1.legend()
    if series["hellaswag"]:
        steps = sorted(series["hellaswag"])
        ax2.plot(steps, [series["hellaswag"][s] for s in steps], marker="o", label="this run")
    else:
        ax2.text(0.5, 0.5, "no HellaSwag evaluations in this log", ha="center", transform=ax2.transAxes)
    ax2.axhline(GPT2_HELLASWAG, color="r", ls="--", label=f"OpenAI GPT-2 124M ({GPT2_HELLASWAG})")
    ax2.axhline(GPT3_HELLASWAG, color="g", ls="--", label=f"OpenAI GPT-3 124M ({GPT3_HELLASWAG})")
    ax2.set(xlabel="step", ylabel="acc_norm", title="HellaSwag")
    ax2.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--log", default="log/metrics.jsonl", help="train_gpt2.py's metrics.jsonl")
    parser.add_argument("--out", default=None, help="PNG to write (default: plot.png beside the log)")
    parser.add_argument("--logy", action="store_true", help="log-scale loss axis")
    parser.add_argument("--gpt2_val_loss", type=float, default=None,
                        help="draw OpenAI GPT-2 124M's loss on the same validation data as a reference line")
    args = parser.parse_args()
    try:
        series = load_metrics(args.log)
    except (OSError, ValueError) as e:
        parser.error(str(e))
    out = args.out or os.path.join(os.path.dirname(args.log) or ".", "plot.png")
    plot(series, out, args.logy, args.gpt2_val_loss)
    print(f"wrote {out}: {len(series['loss'])} train steps, {len(series['val_loss'])} val evals, "
          f"{len(series['hellaswag'])} HellaSwag evals")


if __name__ == "__main__":
    main()
