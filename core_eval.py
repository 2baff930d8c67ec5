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

import numpy as np
import torch

from gptlib import packing, runtime
from gptlib.errors import UserError, check_range, command_line, first_line, main_guard
from gptlib.tokenizer import encode_many, get_encoding, iter_jsonl

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
            if os.name == "posix":  # nothing downloaded, no lock file left (Windows' goes when released)
                os.remove(path + ".lock")  # a process waiting for it locks another: filelock checks
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


def timing_note(bundle, option):
    """The NOTE beside the CORE of a bundle made_for_timing, else None; option: the setting that gave it."""
    if bundle and made_for_timing(bundle):
        return (f"{bundle} was made by dev/make_core_bundle.py to time CORE's shapes from local files, not "
                f"DCLM's data: this CORE means nothing (without {option}, DCLM's is downloaded)")
    return None


def made_for_timing(bundle):
    """Whether bundle is one dev/make_core_bundle.py made, every task's category "bench": CORE's shapes from
    local files, not DCLM's data, so its CORE means nothing."""
    with open(os.path.join(bundle, "eval_meta_data.csv"), encoding="utf-8", newline="") as f:
        return {row.get("Task Category") for row in csv.DictReader(f)} == {"bench"}


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

def prompts(task, i, demos=None):
    """The texts to score for example i of task, one per option (multiple choice, schema) or the context
    without and with its continuation (language modelling), as (head, tails): each text is the pieces
    head + tail, for each of tails. The pieces: its few-shot examples (each after the blank line that ends
    the one before: demo()'s two pieces), the example's context, then its delimiter with what follows;
    parts() cuts a text only between pieces, and head's once for all its texts. demos: demo() of each row,
    made once per task (Prepared), else made here for the drawn ones."""
    rows, d = task.examples, task.delimiter
    shots = [piece for k in drawn(task, i) for piece in (demos[k] if demos else demo(task, rows[k]))]
    if shots:
        shots[0] = shots[0][2:]  # the first follows the <|endoftext|>, not a blank line
    lead = "\n\n" if shots else ""
    ex = rows[i]
    if task.kind == "multiple_choice":
        return [*shots, lead + ex["query"]], [[d + choice] for choice in ex["choices"]]
    if task.kind == "schema":
        return shots, [[lead + context, d + ex["continuation"]] for context in ex["context_options"]]
    context = lead + ex["context"].strip()
    without, last = "".join(shots) + context + d, (context + d).rstrip()
    if not last or without[:1].isspace():  # strip() would reach past the last piece: one piece each
        return [], [[without.strip()], [without + ex["continuation"]]]
    return shots, [[last], [context, d + ex["continuation"]]]


def texts(task, i):
    """Example i's texts to score, each whole (prompts())."""
    head, tails = prompts(task, i)
    return ["".join(head + tail) for tail in tails]


def drawn(task, i):
    """The indices of example i's few-shot examples, drawn as nanochat draws them: never the example itself
    (a task with fewer examples than shots: all the others)."""
    if not task.shots:
        return []
    # nanochat samples the list of the others' indices; sample() picks positions by the length alone, so a
    # range of positions draws the same ones without building that list (n of them, for each example)
    n = len(task.examples)
    return [p + (p >= i) for p in random.Random(1234 + i).sample(range(n - 1), min(task.shots, n - 1))]


def demo(task, row):
    """A row as a few-shot example, in two pieces: a blank line and its context, then the delimiter and its
    right continuation. Those are the pieces of the row's own prompt, so parts() finds the same parts in
    both, and each is encoded once."""
    d = task.delimiter
    if task.kind == "multiple_choice":
        return "\n\n" + row["query"], d + row["choices"][row["gold"]]
    if task.kind == "schema":
        return "\n\n" + row["context_options"][row["gold"]], d + row["continuation"]
    return "\n\n" + row["context"].strip(), d + row["continuation"]


SPACES = " \t\n\v\f\r"  # whitespace to Python and to GPT-2's pre-tokenizer (regex \s: Unicode's White_Space)


def parts(pieces):
    """A text's pieces (prompts()) joined into the parts Prepared encodes one by one: two pieces stay apart
    where a character that is not whitespace meets whitespace, as GPT-2's pre-tokenizer splits there
    wherever it is. No pre-token holds a non-space character followed by whitespace (whitespace only leads
    one, or makes one), and none looks behind its start (nor, from inside a part, past its end: a part cut
    off ends in a non-space); BPE merges within a pre-token. So the parts' tokens, joined, are the whole
    text's. (str.isspace() holds for every White_Space character and a few more, so a character it rejects
    is no regex whitespace; SPACES are whitespace to both.)"""
    out = pieces[:1]
    for piece in pieces[1:]:
        if out[-1] and piece and piece[0] in SPACES and not out[-1][-1].isspace():
            out.append(piece)
        else:
            out[-1] += piece
    return out


def split(head, tails):
    """parts() of each text head + tail (prompts()), as [head's parts but its last] + [each text's other
    parts], head cut once: parts() folds from the left, looking at the part it holds and the next piece."""
    head = parts(head)
    return [head[:-1]] + [parts(head[-1:] + tail) for tail in tails]


def scored(task, i, seqs, block_size):
    """(token sequences, the scored span (start, end) of each, label) of example i of task, from its
    prompts' token sequences (int64 arrays, each <|endoftext|> then the prompt's tokens): the scored tokens
    are those after the options' common prefix (multiple choice), the common suffix (schema), or the
    continuation (language modelling: one sequence, label None). A sequence longer than block_size loses its
    first tokens."""
    label = task.examples[i].get("gold")
    if task.kind == "multiple_choice":
        start = packing.common_prefix(seqs)
        spans = [(start, len(s)) for s in seqs]
    elif task.kind == "schema":  # an option that is all suffix (identical contexts) scores nothing, as below
        suffix = packing.common_prefix([s[::-1] for s in seqs])
        spans = [(len(s) - suffix if suffix < len(s) else len(s), len(s)) for s in seqs]
    else:
        without, seq = seqs
        if len(seq) <= len(without) or not np.array_equal(seq[:len(without)], without):
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


def encode(task, i, enc, block_size):
    """scored() of example i, each prompt encoded whole: the one-example path (evaluate_unbatched), against
    which the parts Prepared encodes are tested."""
    return scored(task, i, [np.array([enc.eot_token] + enc.encode_ordinary(text)) for text in texts(task, i)],
                  block_size)


class Prepared:
    """The tasks' examples as this rank's packed batches (packing.Prepared, one for all tasks), tokenized
    and packed once: a training run prepares them once for all its evaluations. A task at a time, this
    rank's prompts are cut into parts() and each distinct part is encoded once (a few-shot example recurs in
    10 prompts, and in each option; an example's context, in each option), on rt.cpus threads."""

    def __init__(self, tasks, rt, batch_size, block_size):
        self.tasks, self.task_of = tasks, [t for t, task in enumerate(tasks) for _ in task.examples]
        items, enc, at = [None] * len(self.task_of), get_encoding(), 0  # at: the task's first item
        eot = np.array([enc.eot_token])
        with runtime.together(rt):  # an example only this rank encodes may be damaged: every rank stops
            for task in tasks:
                mine = [i for i in range(len(task.examples)) if (at + i) % rt.world_size == rt.rank]
                demos = [demo(task, row) for row in task.examples] if task.shots else None
                known = {}  # the task's distinct parts -> their index
                ids = [[[known.setdefault(part, len(known)) for part in p]
                        for p in split(*prompts(task, i, demos))] for i in mine]  # [shared, *each text's]
                tokens = [np.array(t, dtype=np.int64) for t in encode_many(enc, known, rt.cpus)]  # (in order)
                for i, (shared, *rests) in zip(mine, ids):
                    shared = np.concatenate([eot] + [tokens[part] for part in shared])
                    seqs = [np.concatenate([shared] + [tokens[part] for part in rest]) for rest in rests]
                    seqs, spans, label = scored(task, i, seqs, block_size)
                    items[at + i] = (packing.pack(seqs, spans), label)
                at += len(task.examples)
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
def evaluate_unbatched(model, tasks, rt):
    """The per-example loop packing replaces (nanochat's way): each example's sequences padded into one
    batch, the whole logits computed, the scored tokens' losses averaged (or their argmaxes compared).
    Same results as evaluate(); one process."""
    enc, right, counts, at = get_encoding(), [], [], 0
    for task in tasks:
        n_right = 0
        for i in range(len(task.examples)):
            seqs, spans, label = encode(task, i, enc, model.config.block_size)
            T = max(len(s) for s in seqs)
            x = torch.tensor([s.tolist() + [enc.eot_token] * (T - len(s)) for s in seqs], device=rt.device)
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
    parser.add_argument("--bundle", "--core_bundle", default=None,
                        help="the eval bundle's folder (core.yaml, eval_meta_data.csv, eval_data/; default: "
                        "download once into core_data/); --core_bundle as train_gpt2.py names it")
    parser.add_argument("--max_per_task", type=int, default=None,
                        help="the first N examples of each task after nanochat's shuffle (nanochat: 500)")
    parser.add_argument("--json", default=None, help="also write the result here")
    parser.add_argument("--device", default="auto", help="auto (cuda, then mps, then cpu), cuda, mps or cpu")
    parser.add_argument("--batch_size", type=int, default=None,
                        help="examples per forward, a row each (default: 16 on a GPU, 4 on a CPU)")
    parser.add_argument("--compile", default="auto", choices=["auto", "True", "False"],
                        help="torch.compile the model, as a training run's --core does (auto: on CUDA); the "
                        "rows' lengths are compiled once, as dynamic")
    parser.add_argument("--unbatched", action="store_true", help="one example per forward: the slow loop")
    args = parser.parse_args()
    check_range("--max_per_task", args.max_per_task, 1)
    check_range("--batch_size", args.batch_size, 1)
    if args.json and not os.path.isdir(os.path.dirname(os.path.abspath(args.json))):
        raise UserError(f"--json={args.json}: its folder does not exist")

    from gptlib.checkpoint import load_model
    rt = runtime.setup(args.device)
    if args.unbatched and rt.distributed:
        raise UserError("--unbatched runs in one process: drop torchrun, or --unbatched")
    compile, note = runtime.compile_choice("False" if args.unbatched else args.compile, rt)
    if note and rt.master:
        print(f"NOTE: {note}")
    t0 = time.time()
    tasks = load_tasks(args.bundle, args.max_per_task)
    model = load_model(args.model, "--model").to(rt.device).eval()
    times = {"reading": time.time() - t0}
    t0 = time.time()
    if args.unbatched:
        result = evaluate_unbatched(model, tasks, rt)
        times["one example per forward"] = time.time() - t0
    else:
        prepared = Prepared(tasks, rt, args.batch_size or (16 if rt.kind == "cuda" else 4),
                            model.config.block_size)
        times["tokenizing and packing"], t0 = time.time() - t0, time.time()
        result = evaluate(torch.compile(model) if compile else model, prepared, rt, progress=rt.master)
        times["forwards" + (", compiling included" if compile else "")] = time.time() - t0
    if rt.master:
        print(table(tasks, result))
        n = sum(len(t.examples) for t in tasks)
        print(f"CORE {result['core']:.4f} ({n:,} examples, {len(tasks)} tasks; {sum(times.values()):.1f} s: "
              + ", ".join(f"{what} {dt:.1f} s" for what, dt in times.items()) + ")")
        if note := timing_note(args.bundle, "--bundle"):
            print(f"NOTE: {note}")
        if args.json:
            with open(args.json, "w", encoding="utf-8") as f:
                json.dump({"core": result["core"], "tasks": result["tasks"], "seconds": times}, f, indent=1)


if __name__ == "__main__":
    main_guard(main, runtime.exit_process)
