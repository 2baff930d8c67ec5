"""Plot a training run from its log: loss (train, validation), validation bits per byte, and HellaSwag
acc_norm and CORE where the run evaluated them (a panel each, with OpenAI's models' published levels),
against step, optionally against a baseline run, and say how the two runs' settings differ.

    python plot.py                                          # log/metrics.jsonl -> log/plot.png
    python plot.py --log run/metrics.jsonl --out run.png --logy
    python plot.py --log=log --gpt2_log=log_gpt2            # vs OpenAI GPT-2, same data (docs/reproduce.md)
    python plot.py --report                                 # and log/report.md: what ran, what it reached

A log is a metrics.jsonl or its folder. A baseline (--baseline, or --gpt2_log) is any train_gpt2.py log: an
--eval_only=True run is drawn as level lines (one evaluation), a training run as dashed curves. Works on a
resumed run (the log is appended; a step done twice keeps its last values) and on a run still writing its
log (a half-written last line is skipped).
"""
import json
import os

from core_eval import GPT2_CORE
from gptlib.errors import UserError, command_line, main_guard, plural
from gptlib.runlog import duration, metrics_path, read_log

# Published HellaSwag acc_norm (all 10,042 validation examples) of OpenAI's models, by the shape of the run
# (n_layer, n_embd) they match; no figure for a size where none was published.
REFERENCES = {
    (12, 768): [  # GPT-2 124M
        # OpenAI's GPT-2 124M weights, completion style as hellaswag.py scores it: 0.2955 (karpathy/llm.c,
        # dev/data/hellaswag.py's docstring; build-nanogpt's hellaswag.py gives the same)
        ("OpenAI GPT-2 124M", 0.2955),
        # GPT-3 Small (125M), zero-shot: 33.7% (Brown et al. 2020, "Language Models are Few-Shot Learners")
        ("OpenAI GPT-3 125M", 0.337)],
    (48, 1600): [  # GPT-2 1558M (XL)
        # OpenAI's GPT-2 XL weights, completion style: 0.4893 (the same llm.c docstring)
        ("OpenAI GPT-2 1558M", 0.4893)],
}
SERIES = ("loss", "val_loss", "val_bpb", "hellaswag", "core")


def load_metrics(path, records=None):
    """{"loss": {step: v}, "val_loss": ..., "val_bpb": ..., "hellaswag": ..., "core": ...} from a
    metrics.jsonl (its records, where read already)."""
    series = {key: {} for key in SERIES}
    for record in read_log(path) if records is None else records:
        if "event" in record:
            continue
        for key in series:
            if key in record:
                series[key][record["step"]] = record[key]
    if not any(series.values()):
        raise UserError(f"{path} holds no loss or evaluation records yet")
    return series


def settings(path, records=None):
    """The newest start record's settings, flat: {"config.B": 8, "model_config.n_layer": 12, "run.torch":
    ...} (from its records, where read already)."""
    starts = [r for r in (read_log(path) if records is None else records) if r.get("event") == "start"]
    if not starts:
        return {}
    return {f"{part}.{k}": v for part in ("config", "model_config", "run")
            for k, v in (starts[-1].get(part) or {}).items()}


def settings_diff(a, b):
    """Lines 'name: a -> b' for each setting but the log_dir that differs between two settings()."""
    missing = "(absent)"
    return [f"{k}: {a.get(k, missing)!r} -> {b.get(k, missing)!r}" for k in sorted(a.keys() | b.keys())
            if k != "config.log_dir" and a.get(k, missing) != b.get(k, missing)]


def reference_levels(run_settings):
    """[(label, HellaSwag acc_norm)] published for the model size of a run (its settings())."""
    shape = (run_settings.get("model_config.n_layer"), run_settings.get("model_config.n_embd"))
    return REFERENCES.get(shape, [])


def plot(series, out, logy=False, baseline=None, baseline_label="baseline", references=()):
    """Writes the PNG: loss, bits per byte and (when either log has any) HellaSwag with the reference levels
    given and CORE with OpenAI's GPT-2s' (core_eval.GPT2_CORE), on one step axis."""
    import matplotlib
    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt

    panels = [([("loss", "train loss", dict(alpha=0.6, lw=1)), ("val_loss", "val loss", dict(marker="o"))],
               "loss (nats per token)", []),
              ([("val_bpb", "val bits per byte", dict(marker="o"))], "val bits per byte", [])]
    gpt2s = [(f"OpenAI GPT-2 {size}", v) for size, v in GPT2_CORE.items()]
    for key, title, levels in (("hellaswag", "HellaSwag acc_norm", references), ("core", "CORE", gpt2s)):
        if series.get(key) or (baseline and baseline.get(key)):  # --hellaswag=0: no empty panel
            panels.append(([(key, "this run", dict(marker="o"))], title, levels))
    # one step axis for all panels: evaluations line up with the train loss of the same step
    fig, axes = plt.subplots(1, len(panels), figsize=(7 * len(panels), 5), sharex=True)
    for ax, (keys, title, levels) in zip(axes, panels):
        for key, label, style in keys:
            steps = sorted(series[key])
            if steps:
                ax.plot(steps, [series[key][s] for s in steps], label=label, **style)
            if baseline and key != "loss" and baseline[key]:  # the baseline's evaluations, not its train loss
                steps = sorted(baseline[key])
                if len(steps) == 1:  # an eval-only run: one value
                    value = baseline[key][steps[0]]
                    ax.axhline(value, color="k", ls=":", label=f"{baseline_label} ({value:.4f})")
                else:
                    ax.plot(steps, [baseline[key][s] for s in steps], color="k", ls="--",
                            label=baseline_label)
        if not any(series[key] for key, _, _ in keys):
            ax.text(0.5, 0.5, "no such records in this log", ha="center", transform=ax.transAxes)
        for (label, value), color in zip(levels, ("r", "g", "b", "m")):
            ax.axhline(value, color=color, ls="--", label=f"{label} ({value})")
        ax.set(xlabel="step", title=title)
    if logy:
        axes[0].set_yscale("log")
    for ax in axes:
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return [(ax.get_title(), ax.get_xlim()) for ax in axes]  # what was drawn: each panel and its step range


def report(path, records, series, plot_file=None):
    """A run's report in markdown, from its metrics.jsonl alone (path; its records and load_metrics' series):
    the same text whenever it is made from the same log. What ran, how long and how fast, what it reached,
    its last samples, and plot_file."""
    import statistics
    records = [r for r in records if "event" not in r or r["event"] == "start"]
    starts = [r for r in records if r.get("event") == "start"]
    if not starts:
        raise UserError(f"{path} holds no start record: is it a train_gpt2.py metrics.jsonl?")
    start = starts[-1]
    config, run, model = start["config"], start.get("run") or {}, start.get("model_config") or {}
    steps = {r["step"]: r for r in records if "loss" in r and "event" not in r}  # a step redone: its last
    last = steps[max(steps)] if steps else {}
    lines = [f"# {config.get('log_dir', os.path.dirname(path))}", "", "## What ran", "",
             f"- settings that differ from train_gpt2.py's settings block: "
             f"{json.dumps(start.get('differs', {})) if 'differs' in start else '(not recorded)'}",
             f"- model: {model.get('n_layer')} layers, {model.get('n_head')} heads, {model.get('n_embd')} "
             f"wide, vocabulary {model.get('vocab_size')}, {model.get('block_size')} positions"
             + "".join(f", {k}" for k in ("rotary", "qk_norm", "relu2", "untied_head", "rmsnorm",
                                          "embed_norm") if model.get(k)),
             f"- hardware: {plural(start.get('world_size'), 'process', 'processes')} on "
             f"{plural(run.get('hosts'), 'host')}: "
             + ", ".join(f"{n} x {name}" for name, n in (run.get("devices") or {}).items())
             + f"; {run.get('dtype')}, compile {run.get('compile')}",
             f"- versions: Python {run.get('python')}, torch {run.get('torch')}, CUDA {run.get('cuda')}",
             f"- code: commit {run.get('git_commit')}"
             + (" with local changes" if run.get("git_dirty") else ""),
             f"- starts: {len(starts)} (the first and {plural(len(starts) - 1, 'resume')})", "",
             "## Training", ""]
    if steps:
        tok_s = [r["tok_s"] for r in steps.values() if r.get("tok_s")]
        util = [r["mfu"] for r in steps.values() if r.get("mfu") is not None]
        mem = [r["peak_memory"] for r in steps.values() if r.get("peak_memory") is not None]
        lines += [f"- steps: {max(steps):,} of {config.get('max_steps'):,}; tokens seen: "
                  f"{max(steps) * config.get('total_batch_size', 0):,}",
                  f"- training time: {duration(last.get('elapsed'))}; median {statistics.median(tok_s):,.0f} "
                  "tok/s" + (f", median MFU {statistics.median(util):.1%}" if util else "")
                  + (f"; a step's peak GPU memory {max(mem) / 2**30:.2f} GiB (rank 0)" if mem else ""),
                  f"- final train loss {last['loss']:.4f}"]
    lines += ["", "## Evaluation", ""]
    for key, name in (("val_loss", "val loss"), ("val_bpb", "val bits per byte"),
                      ("hellaswag", "HellaSwag acc_norm"), ("core", "CORE")):
        values = series[key]
        if values:
            best = (max if key in ("hellaswag", "core") else min)(values, key=values.get)
            lines.append(f"- {name}: {values[max(values)]:.4f} at step {max(values)} (best "
                         f"{values[best]:.4f} at step {best})")
    tasks = [r for r in records if "core_tasks" in r]
    if tasks:  # the newest CORE evaluation, task by task
        lines.append(f"- CORE's tasks at step {tasks[-1]['step']} (accuracy): "
                     + ", ".join(f"{label} {acc:.4f}" for label, acc in tasks[-1]["core_tasks"].items()))
    samples = [r for r in records if "samples" in r]
    if samples:
        lines += ["", f"## Samples at step {samples[-1]['step']}", ""]
        lines += [f"    {text!r}" for text in samples[-1]["samples"]]
    if plot_file:  # the panels plot() drew for this run
        drawn = ["loss", "bits per byte"] + [name for key, name in (("hellaswag", "HellaSwag"),
                                                                    ("core", "CORE")) if series.get(key)]
        lines += ["", f"![{', '.join(drawn[:-1])} and {drawn[-1]}]({plot_file})"]
    return "\n".join(lines) + "\n"


def write_report(path):
    """plot.png and report.md beside a run's metrics.jsonl (read once); returns the report's path."""
    folder, records = os.path.dirname(path) or ".", read_log(path)
    series = load_metrics(path, records)
    plot(series, os.path.join(folder, "plot.png"), references=reference_levels(settings(path, records)))
    out = os.path.join(folder, "report.md")
    with open(out + ".tmp", "w", encoding="utf-8") as f:
        f.write(report(path, records, series, "plot.png"))
    os.replace(out + ".tmp", out)
    return out


def main():
    parser = command_line(__doc__)
    parser.add_argument("--log", default="log", help="train_gpt2.py's metrics.jsonl or its folder")
    parser.add_argument("--out", default=None, help="PNG to write (default: plot.png beside the log)")
    parser.add_argument("--logy", action="store_true", help="log-scale loss axis")
    parser.add_argument("--baseline", "--gpt2_log", default=None,
                        help="another run's log, drawn as reference lines, its differing settings printed; "
                        "as --gpt2_log, that of train_gpt2.py --eval_only=True --init_from=gpt2 "
                        "--log_dir=log_gpt2: GPT-2's own loss on your validation shard")
    parser.add_argument("--report", action="store_true",
                        help="also write report.md beside the log (with plot.png), as a finished run does")
    args = parser.parse_args()
    args.log, args.baseline = (metrics_path(p) if p and os.path.isdir(p) else p
                               for p in (args.log, args.baseline))
    if args.report:
        print(f"wrote {write_report(args.log)} and plot.png beside it")
        return
    records = read_log(args.log)  # each log read once
    series, run = load_metrics(args.log, records), settings(args.log, records)
    baseline, diff, label = None, [], None
    if args.baseline:
        base_records = read_log(args.baseline)
        baseline, base = load_metrics(args.baseline, base_records), settings(args.baseline, base_records)
        diff = settings_diff(run, base)
        label = (f"{base['config.init_from']} (eval only)" if base.get("config.eval_only")
                 else os.path.dirname(args.baseline) or args.baseline)
    out = args.out or os.path.join(os.path.dirname(args.log) or ".", "plot.png")
    folder = os.path.dirname(out) or "."
    if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        what = "is not writable" if os.path.isdir(folder) else "does not exist"
        raise UserError(f"--out {out}: the folder {folder} {what}: create it, or choose another --out")
    plot(series, out, args.logy, baseline, label, reference_levels(run))
    print(f"wrote {out}: " + ", ".join(plural(len(series[key]), name) for key, name in (
        ("loss", "train step"), ("val_loss", "val eval"), ("hellaswag", "HellaSwag eval"))))
    if args.baseline:
        print(f"settings that differ ({args.log} -> {args.baseline}):" if diff else "settings: the same")
        for line in diff:
            print(f"  {line}")


if __name__ == "__main__":
    main_guard(main)
