"""CORE: DCLM's base-model score (22 in-context tasks; each accuracy centered by the task's random baseline,
then averaged), the number nanochat's "time to GPT-2" is judged by. Packed and DDP-aware (packing.py).

    python core_eval.py --model log/model_019073.pt        # the bundle: downloaded once into core_data/
    python core_eval.py --model gpt2 --bundle eval_bundle --max_per_task 500 --json core.json
    torchrun --nproc_per_node=8 core_eval.py --model log/model_019073.pt

Scored as DCLM and nanochat score it. Each prompt is GPT-2's <|endoftext|> (the BOS), then the few-shot
examples (drawn per example by random.Random(1234 + index) from the task's others), each followed by a blank
line, then the example; a task's continuation delimiter joins a context to its continuation. Multiple choice
(one context, several continuations) and schema (several contexts, one continuation): the option whose
scored tokens (those after the options' common token prefix, or the common token suffix) have the lowest
mean cross-entropy wins. Language modelling: right when every continuation token is the model's greedy one.
A prompt longer than the model's positions is cropped from the left. centered = (accuracy - b/100) /
(1 - b/100), b the task's random baseline in percent. --max_per_task N takes the first N of each task after
nanochat's shuffle (random.Random(1337)), so subsets agree with its numbers.
OpenAI's GPT-2, as nanochat measured it: 124M 0.1139, 355M 0.1849, 774M 0.2146, 1558M 0.2565.
"""
import csv
import json
import os
import random
import shutil
import time
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass

import torch

import packing
import runtime
from documents import iter_jsonl
from errors import UserError, check_range, command_line, first_line, main_guard
from packing import common_prefix
from tokenizer import get_encoding

BUNDLE_URL = "https://karpathy-public.s3.us-west-2.amazonaws.com/eval_bundle.zip"  # nanochat's copy of DCLM's
CACHE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "core_data")
GPT2_CORE = {"124M": 0.1139, "350M": 0.1849, "774M": 0.2146, "1558M": 0.2565}  # OpenAI's, by nanochat
KINDS = ("multiple_choice", "schema", "language_modeling")


@dataclass
class Task:
    label: str
    kind: str  # one of KINDS
    shots: int  # few-shot examples in front of each
    delimiter: str  # between a context and its continuation
    baseline: float  # the accuracy of guessing, in percent
    examples: list  # its rows, shuffled, the first max_per_task


# ------------------------------------------------------------------------------------------------ the bundle

def download(cache_dir=CACHE_DIR, option="--bundle"):
    """The eval bundle's folder in cache_dir, downloaded and unpacked once. Every process may call this at
    once (all ranks do): a file lock lets the first download while the others wait. Unpacked into a
    temporary folder and renamed when complete: a folder of that name is a whole bundle. option: the
    setting that takes a copy placed by hand, for messages."""
    from filelock import FileLock
    path = os.path.join(cache_dir, "eval_bundle")
    os.makedirs(cache_dir, exist_ok=True)
    with FileLock(path + ".lock"):
        if os.path.isdir(path):
            return path
        print(f"core: downloading {BUNDLE_URL} to {path}")
        tmp = path + ".tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            urllib.request.urlretrieve(BUNDLE_URL, tmp + ".zip")
        except (urllib.error.URLError, OSError) as e:
            raise UserError(f"could not download the CORE eval bundle ({getattr(e, 'reason', e)}); offline, "
                            f"download {BUNDLE_URL} elsewhere, unzip it and pass its eval_bundle folder with "
                            f"{option} (core.yaml, eval_meta_data.csv, eval_data/)") from None
        with zipfile.ZipFile(tmp + ".zip") as z:
            z.extractall(tmp)
        os.replace(os.path.join(tmp, "eval_bundle"), path)
        os.remove(tmp + ".zip")
        shutil.rmtree(tmp)
    return path


def load_tasks(bundle=None, max_per_task=None, option="--bundle"):
    """The tasks of an eval bundle folder in DCLM's layout (core.yaml, eval_meta_data.csv, eval_data/), or,
    with bundle None, of the one downloaded into core_data/. Each task's rows shuffled as nanochat does,
    then the first max_per_task kept. option: the setting that gives bundle, for messages."""
    import yaml  # pyyaml: in requirements.txt (and a dependency of datasets)
    bundle = download(option=option) if bundle is None else bundle
    config, meta = os.path.join(bundle, "core.yaml"), os.path.join(bundle, "eval_meta_data.csv")
    for path in (config, meta):
        if not os.path.isfile(path):
            raise UserError(f"{path} does not exist: {option} takes the eval bundle's folder (core.yaml, "
                            "eval_meta_data.csv, eval_data/)")
    with open(config, encoding="utf-8") as f:
        try:
            icl = yaml.safe_load(f)
        except yaml.YAMLError as e:
            raise UserError(f"{config}: not valid YAML ({first_line(e)}): a damaged bundle?") from None
    if not isinstance(icl, dict) or not isinstance(icl.get("icl_tasks"), list):
        raise UserError(f"{config}: no list of icl_tasks in it: not DCLM's core.yaml")
    with open(meta, encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows or not {"Eval Task", "Random baseline"} <= set(rows[0]):
        raise UserError(f"{meta}: no 'Eval Task' and 'Random baseline' columns: not DCLM's "
                        "eval_meta_data.csv")
    baselines = {row["Eval Task"]: float(row["Random baseline"]) for row in rows}
    tasks = []
    for k, t in enumerate(icl["icl_tasks"]):
        missing = [key for key in ("label", "icl_task_type", "dataset_uri", "num_fewshot")
                   if not isinstance(t, dict) or key not in t]
        if missing or not isinstance(t["num_fewshot"], list) or not t["num_fewshot"]:
            raise UserError(f"{config}: task {k + 1} has no {', '.join(missing) or 'list of num_fewshot'}: "
                            "not DCLM's core.yaml (a damaged bundle?)")
        if t["icl_task_type"] not in KINDS:
            raise UserError(f"{config}: task {t['label']} has type {t['icl_task_type']!r}, not one of "
                            f"{KINDS}")
        if t["label"] not in baselines:
            raise UserError(f"{meta} has no random baseline for task {t['label']}")
        data = os.path.join(bundle, "eval_data", t["dataset_uri"])
        if not os.path.isfile(data):
            raise UserError(f"{data} does not exist: the bundle is incomplete (task {t['label']})")
        rows = [checked(row, where, t["icl_task_type"]) for where, row in iter_jsonl(data)]  # one line each
        random.Random(1337).shuffle(rows)
        tasks.append(Task(t["label"], t["icl_task_type"], t["num_fewshot"][0],
                          t.get("continuation_delimiter", " "), baselines[t["label"]], rows[:max_per_task]))
    return tasks


FIELDS = {"multiple_choice": ("query", "choices", "gold"),  # what a row of each kind must hold
          "schema": ("context_options", "continuation", "gold"),
          "language_modeling": ("context", "continuation")}


def checked(row, where, kind):
    """A task's row, with the fields its kind reads, and its gold one of its options: else a UserError naming
    the file and line (where)."""
    missing = [key for key in FIELDS[kind] if not isinstance(row, dict) or key not in row]
    if missing:
        raise UserError(f"{where}: a {kind} row without {', '.join(missing)} (a damaged bundle?)")
    options = row.get("choices", row.get("context_options"))
    if "gold" in row and not (isinstance(options, list) and isinstance(row["gold"], int)
                              and 0 <= row["gold"] < len(options)):
        raise UserError(f"{where}: gold={row['gold']!r} is not the index of one of its "
                        f"{len(options) if isinstance(options, list) else 'no'} options (a damaged bundle?)")
    return row


# ------------------------------------------------------------------------------------------------ prompts

def prompts(task, i):
    """(texts, cuts): the texts to score for example i of task, one per option (multiple choice, schema) or
    the context without and with its continuation (language modelling), and where in each the blank line
    after each few-shot example begins (the same offsets in every text: they share the few-shot examples),
    places that tokens() may cut them at."""
    rows, d = task.examples, task.delimiter
    shots = []
    if task.shots:  # drawn per example, never the example itself (a subset smaller than that: all the others)
        # nanochat samples the list of the others' indices; sample() picks positions by the length alone, so
        # a range of positions draws the same ones without building that list (n of them, for each example)
        picked = random.Random(1234 + i).sample(range(len(rows) - 1), min(task.shots, len(rows) - 1))
        shots = [rows[p + (p >= i)] for p in picked]  # position p of the others is row p, or p + 1 past i
    ex = rows[i]
    if task.kind == "multiple_choice":
        head, cuts = few_shot([f"{s['query']}{d}{s['choices'][s['gold']]}" for s in shots])
        return [f"{head}{ex['query']}{d}{choice}" for choice in ex["choices"]], cuts
    if task.kind == "schema":
        head, cuts = few_shot([f"{s['context_options'][s['gold']]}{d}{s['continuation']}" for s in shots])
        return [f"{head}{context}{d}{ex['continuation']}" for context in ex["context_options"]], cuts
    head, cuts = few_shot([f"{s['context'].strip()}{d}{s['continuation']}" for s in shots])
    without = f"{head}{ex['context'].strip()}{d}"
    # strip() from the left would move the cuts: where it strips anything, none is made
    return [without.strip(), without + ex["continuation"]], cuts if without[:1].strip() else []


def few_shot(examples):
    """The few-shot examples' texts as one head, each followed by a blank line, and where each blank line
    begins."""
    head, cuts = "", []
    for text in examples:
        head += text
        cuts.append(len(head))
        head += "\n\n"
    return head, cuts


def tokens(text, cuts, enc, cache):
    """enc.encode_ordinary(text), with the parts between its cuts encoded once each and kept in cache (a
    few-shot example recurs in many prompts: 10-shot, in 10 examples, in each option). A cut where a character
    that is not whitespace meets a newline is a boundary of GPT-2's pre-tokenizer wherever it is: no
    pre-token holds a non-space character followed by whitespace (whitespace only leads one, or makes one),
    and none looks behind its start; BPE merges within a pre-token. So the parts' tokens, joined, are the
    whole text's. Other cuts are not made."""
    out, start = [], 0
    for p in cuts:
        if 0 < p < len(text) and text[p] == "\n" and not text[p - 1].isspace():  # isspace: all Unicode's
            part = text[start:p]
            if part not in cache:
                cache[part] = enc.encode_ordinary(part)
            out += cache[part]
            start = p
    return out + enc.encode_ordinary(text[start:])


def encode(task, i, enc, block_size, cache=None):
    """(token sequences, the scored span (start, end) of each, label) of example i: <|endoftext|> then the
    prompt's tokens (tokens(): the few-shot examples' from cache, a dict kept per task); the scored tokens are
    those after the options' common prefix (multiple choice), the common suffix (schema), or the continuation
    (language modelling: one sequence, label None). A sequence longer than block_size loses its first
    tokens."""
    texts, cuts = prompts(task, i)
    cache = {} if cache is None else cache
    seqs = [[enc.eot_token] + tokens(text, cuts, enc, cache) for text in texts]
    label = task.examples[i].get("gold")
    if task.kind == "multiple_choice":
        start = common_prefix(seqs)
        spans = [(start, len(s)) for s in seqs]
    elif task.kind == "schema":  # an option that is all suffix (identical contexts) scores nothing, as below
        suffix = common_prefix([s[::-1] for s in seqs])
        spans = [(len(s) - suffix if suffix < len(s) else len(s), len(s)) for s in seqs]
    else:
        without, seq = seqs
        if seq[:len(without)] != without or len(seq) == len(without):
            raise UserError(f"CORE task {task.label}, example {i}: its context's tokens are not a prefix of "
                            "the context and continuation's (a damaged bundle?)")
        seqs, spans, label = [seq], [(len(without), len(seq))], None
    # an option whose tokens are all shared scores nothing: nanochat's mean of no losses is NaN, and Python's
    # min() keeps a NaN it starts with, so such an option 0 wins and any other never does (packing.evaluate)
    for k, (seq, (start, end)) in enumerate(zip(seqs, spans)):
        crop = max(0, len(seq) - block_size)
        if start - crop < 1 and start < end:
            raise UserError(f"CORE task {task.label}, example {i}: its {end - start} scored tokens do not "
                            f"fit the model's block_size={block_size}")
        seqs[k], spans[k] = seq[crop:], (start - crop, end - crop)  # an empty span: start == end
    return seqs, spans, label


class Prepared:
    """The tasks' examples as this rank's packed batches (packing.Prepared, one for all tasks), tokenized
    and packed once: a training run prepares them once for all its evaluations."""

    def __init__(self, tasks, rt, batch_size, block_size):
        self.tasks, self.task_of, items, enc = tasks, [], [], get_encoding()  # task_of: item -> its task
        with runtime.together(rt):  # an example only this rank encodes may be damaged: every rank stops
            for t, task in enumerate(tasks):
                cache = {}  # the task's few-shot examples, encoded once
                for i in range(len(task.examples)):  # packing.Prepared's share of this rank: encoded here
                    mine = len(items) % rt.world_size == rt.rank
                    items.append(encode(task, i, enc, block_size, cache) if mine else None)
                    self.task_of.append(t)
        self.packed = packing.Prepared(items, rt, batch_size)


def centered(accuracy, baseline):
    """Accuracy above chance, as a share of what is above chance: 0 at the random baseline (percent), 1 at
    perfect."""
    return (accuracy - baseline / 100) / (1 - baseline / 100)


def summary(tasks, counts):
    """{"core", "tasks": {label: {"accuracy", "centered", "n"}}} from counts[t] = (examples, right)."""
    out = {}
    for task, (n, right) in zip(tasks, counts):
        accuracy = right / n if n else 0.0
        out[task.label] = {"accuracy": accuracy, "centered": centered(accuracy, task.baseline), "n": n}
    return {"core": sum(t["centered"] for t in out.values()) / len(out), "tasks": out}


@torch.no_grad()
def evaluate(model, prepared, rt, progress=False):
    """CORE of model (a GPT, compiled or not, DDP's module or FSDP-sharded) on Prepared tasks, on the
    device and in the dtype of rt; every rank must call it (packing.evaluate), the counts summed over ranks
    (one all-reduce). Returns summary()'s dict with "predictions": [(item index, right)] of this rank."""
    labels = prepared.packed.labels
    right = [(i, greedy if labels[i] is None else by_mean == labels[i])
             for i, _, by_mean, greedy in packing.evaluate(model, prepared.packed, rt, "core", progress)]
    counts = [[0, 0] for _ in prepared.tasks]  # per task: examples, right
    for i, ok in right:
        counts[prepared.task_of[i]][0] += 1
        counts[prepared.task_of[i]][1] += ok
    if rt.distributed:
        counts = torch.tensor(counts, device=rt.device)
        torch.distributed.all_reduce(counts)
        counts = counts.tolist()
    return {**summary(prepared.tasks, counts), "predictions": right}


@torch.no_grad()
def evaluate_unbatched(model, tasks, rt, progress=False):
    """The per-example loop packing replaces (nanochat's way): each example's sequences padded into one
    batch, the whole logits computed, the scored tokens' losses averaged (or their argmaxes compared).
    Same results as evaluate(); one process."""
    enc, right, counts, at = get_encoding(), [], [], 0
    for task in tasks:
        n_right = 0
        for i in range(len(task.examples)):
            seqs, spans, label = encode(task, i, enc, model.config.block_size)
            T = max(len(s) for s in seqs)
            x = torch.tensor([s + [enc.eot_token] * (T - len(s)) for s in seqs], device=rt.device)
            with runtime.autocast(rt.device, rt.dtype):
                logits, _ = model(x)
            logits = logits.float()
            if label is None:
                (start, end), = spans
                ok = bool((logits[0, start - 1:end - 1].argmax(-1) == x[0, start:end]).all())
            else:
                losses = torch.nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2), x[:, 1:],
                                                           reduction="none")  # (options, T - 1)
                means = [losses[k, s - 1:e - 1].mean().item() for k, (s, e) in enumerate(spans)]
                ok = means.index(min(means)) == label
            right.append((at + i, ok))
            n_right += ok
        counts.append((len(task.examples), n_right))
        at += len(task.examples)
        if progress:
            print(f"core: {task.label} done")
    return {**summary(tasks, counts), "predictions": right}


# ------------------------------------------------------------------------------------------------ CLI

def table(tasks, result):
    """The result as a markdown table: task, shots, type, accuracy, centered, examples; CORE last."""
    lines = ["| task | shots | type | accuracy | centered | examples |",
             "| --- | ---: | --- | ---: | ---: | ---: |"]
    for task in tasks:
        r = result["tasks"][task.label]
        lines.append(f"| {task.label} | {task.shots} | {task.kind} | {r['accuracy']:.4f} | "
                     f"{r['centered']:.4f} | {r['n']:,} |")
    return "\n".join(lines + [f"| **CORE** | | | | **{result['core']:.4f}** | |"])


def main():
    parser = command_line(__doc__)
    parser.add_argument("--model", default="gpt2", help="gpt2[-medium|-large|-xl], an HF GPT-2 folder, or a "
                        "train_gpt2.py checkpoint (.pt)")
    parser.add_argument("--bundle", default=None, help="the eval bundle's folder (core.yaml, "
                        "eval_meta_data.csv, eval_data/; default: download once into core_data/)")
    parser.add_argument("--max_per_task", type=int, default=None,
                        help="the first N examples of each task after nanochat's shuffle (nanochat: 500)")
    parser.add_argument("--json", default=None, help="also write the result here")
    parser.add_argument("--device", default="auto", help="auto (cuda, then mps, then cpu), cuda, mps or cpu")
    parser.add_argument("--batch_size", type=int, default=None,
                        help="examples per forward, a row each (default: 16 on a GPU, 4 on a CPU)")
    parser.add_argument("--unbatched", action="store_true", help="one example per forward: the slow loop")
    args = parser.parse_args()
    check_range("--max_per_task", args.max_per_task, 1)
    check_range("--batch_size", args.batch_size, 1)
    if args.json and not os.path.isdir(os.path.dirname(os.path.abspath(args.json))):
        raise UserError(f"--json={args.json}: its folder does not exist")

    from checkpoint import load_model
    rt = runtime.setup(args.device)
    if args.unbatched and rt.distributed:
        raise UserError("--unbatched runs in one process: drop torchrun, or --unbatched")
    tasks = load_tasks(args.bundle, args.max_per_task)
    model = load_model(args.model).to(rt.device).eval()
    t0 = time.time()
    if args.unbatched:
        result, how = evaluate_unbatched(model, tasks, rt), "one example per forward"
    else:
        prepared = Prepared(tasks, rt, args.batch_size or (16 if rt.kind == "cuda" else 4),
                            model.config.block_size)
        how = f"packed; tokenizing and packing {time.time() - t0:.1f} s"
        result = evaluate(model, prepared, rt, progress=rt.master)
    dt = time.time() - t0
    if rt.master:
        print(table(tasks, result))
        n = sum(len(t.examples) for t in tasks)
        print(f"CORE {result['core']:.4f} ({n:,} examples, {len(tasks)} tasks, {dt:.1f} s, {how})")
        if args.json:
            with open(args.json, "w", encoding="utf-8") as f:
                json.dump({"core": result["core"], "tasks": result["tasks"]}, f, indent=1)


if __name__ == "__main__":
    main_guard(main, runtime.exit_process)
