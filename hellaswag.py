"""HellaSwag evaluation (validation split, 10,042 four-way sentence completions), batched and DDP-aware.

    python hellaswag.py --model gpt2                      # OpenAI GPT-2 124M (needs internet once)
    python hellaswag.py --model log/model_019073.pt --data hellaswag_val.jsonl --limit 1000
    torchrun --nproc_per_node=8 hellaswag.py --model log/model_019073.pt
    python hellaswag.py --download                        # the data alone, for a machine without internet

The method of the GPT-2 reproductions (OpenAI GPT-2 124M: acc_norm 0.2955; GPT-3 125M: 0.337): context
tokens = GPT-2 tokens of `ctx`, each ending = tokens of " " + ending; an ending's score is the cross-entropy
of its tokens given the context, summed (acc) or averaged over its tokens (acc_norm); the lowest loss wins.
evaluate() is the one implementation, used by this script and by train_gpt2.py.
"""
import json
import os
import time

import torch
from torch.nn import functional as F
from tqdm import tqdm

from gptlib import packing, runtime
from gptlib.errors import UserError, check_range, command_line, first_line, main_guard
from gptlib.runtime import autocast, hub_online
from gptlib.tokenizer import encode_many, get_encoding, iter_jsonl

CACHE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hellaswag_data")

# ------------------------------------------------------------------------------------------------ data

def normalize(example, where):
    """The fields we use, checked: ctx (str), endings (4 str), label (int 0-3; the HF copy has it as str)."""
    try:
        ctx, endings, label = example["ctx"], list(example["endings"]), int(example["label"])
    except (KeyError, TypeError, ValueError) as e:
        raise UserError(f"{where}: not a HellaSwag example (needs ctx, endings and an integer "
                        f"label): {e!r}") from None
    if not isinstance(ctx, str) or len(endings) != 4 or not all(isinstance(e, str) for e in endings) \
            or not 0 <= label < 4:
        raise UserError(f"{where}: not a HellaSwag example (ctx must be a string, endings 4 strings, label "
                        "0-3)")
    return {"ctx": ctx, "endings": endings, "label": label}


def download(cache_dir, option="--data"):
    """The validation split as jsonl in cache_dir, downloaded once. Every process may call this at the same
    time (all DDP ranks do): an exclusive file lock lets the first download while the others wait, then
    they all read the finished file. The file is written under a temporary name and renamed when complete.
    option: the setting that takes a local copy instead, for messages."""
    from filelock import FileLock  # in requirements.txt; unlike fcntl it works on Windows too
    path = os.path.join(cache_dir, "hellaswag_val.jsonl")
    if not os.path.exists(path) and not hub_online():  # before any folder or lock file is made
        raise UserError("could not download HellaSwag: the Hugging Face Hub cannot be reached; offline, pass "
                        f"a local copy of hellaswag_val.jsonl (github.com/rowanz/hellaswag) with {option}")
    os.makedirs(cache_dir, exist_ok=True)
    with FileLock(path + ".lock"):  # released on exit, also if this process dies
        if not os.path.exists(path):
            print(f"hellaswag: downloading Rowan/hellaswag (validation) to {path}")
            try:
                from datasets import load_dataset
                ds = load_dataset("Rowan/hellaswag", split="validation")
            except Exception as e:  # offline, no datasets package, Hub outage: the same way out
                raise UserError(f"could not download HellaSwag ({first_line(e)}); offline, pass a local copy "
                                f"of hellaswag_val.jsonl (github.com/rowanz/hellaswag) with {option}") \
                    from None
            with open(path + ".tmp", "w", encoding="utf-8") as f:
                for i, row in enumerate(ds):
                    f.write(json.dumps(normalize(row, f"Rowan/hellaswag validation row {i}")) + "\n")
            os.replace(path + ".tmp", path)
    return path


def load_examples(path=None, limit=None, cache_dir=CACHE_DIR, option="--data"):
    """HellaSwag validation examples from a .jsonl file or a datasets.save_to_disk folder (offline), or,
    with path None, downloaded into cache_dir once. limit keeps the first N. option: the setting that gives
    path, for messages."""
    path = download(cache_dir, option) if path is None else path
    if os.path.isdir(path):
        from datasets import DatasetDict, load_from_disk
        ds = load_from_disk(path)
        if isinstance(ds, DatasetDict):
            ds = ds["validation"]
        examples = [normalize(row, f"{path} row {i}") for i, row in enumerate(ds)]
    elif os.path.isfile(path):
        examples = [normalize(row, where) for where, row in iter_jsonl(path)]
    else:
        raise UserError(f"HellaSwag data {path} does not exist: pass a .jsonl file or save_to_disk "
                        f"folder, or leave {option} out to download it")
    examples = examples[:limit]
    if not examples:
        raise UserError(f"no HellaSwag examples selected from {path} (limit={limit})")
    return examples


# ------------------------------------------------------------------------------------------------ scoring

def encode(example, enc, block_size):
    """(context tokens, [tokens of each ending]): GPT-2 tokens carry the space before a word, so an ending
    is encoded as " " + ending. The context is cropped from the left so that it and the longest ending fit
    the model's block_size positions (GPT-2's 1024 hold every example; a small model's may not); an ending
    longer than block_size is a UserError."""
    return encode_all([example], enc, block_size)[0]


def encode_all(examples, enc, block_size, threads=1):
    """encode() of every example, their texts encoded on `threads` threads (tokenizer.encode_many)."""
    texts = [text for ex in examples for text in (ex["ctx"], *(" " + e for e in ex["endings"]))]
    tokens, out = iter(encode_many(enc, texts, threads)), []
    for ex in examples:
        ctx, ends = next(tokens), [next(tokens) for _ in ex["endings"]]
        longest = max(len(end) for end in ends)
        room = block_size - longest
        if room < 0:
            raise UserError(f"a HellaSwag ending of {longest} tokens does not fit the model's block_size="
                            f"{block_size}: a larger block_size, or --hellaswag=0")
        out.append((ctx[max(0, len(ctx) - room):], ends))
    return out


def render(example, enc, block_size):
    """Token rows context + ending for the 4 endings, and masks marking each row's ending tokens."""
    ctx, ends = encode(example, enc, block_size)
    return [ctx + end for end in ends], [[0] * len(ctx) + [1] * len(end) for end in ends]


def ending_losses(logits, tokens, mask):
    """Per row, the summed and the mean cross-entropy of the masked (ending) tokens. logits (N, T, V).
    Only the ending positions are upcast to float32 and scored, not the whole (N, T, V) tensor."""
    keep = mask[:, 1:].bool()  # position t predicts token t+1
    losses = torch.zeros(keep.shape, device=logits.device)
    losses[keep] = F.cross_entropy(logits[:, :-1][keep].float(), tokens[:, 1:][keep], reduction="none")
    total = losses.sum(1)
    return total, total / keep.sum(1)


def prepare(examples, rt, batch_size, block_size):
    """The examples as this rank's packing.Prepared batches, tokenized and packed once (a training run does
    it once for all its evaluations): each example one row, its context once and its 4 endings after it."""
    mine, items = range(rt.rank, len(examples), rt.world_size), [None] * len(examples)  # tokenized here only
    with runtime.together(rt):  # an example only this rank encodes may not fit: every rank stops
        encoded = encode_all([examples[i] for i in mine], get_encoding(), block_size, rt.cpus)
        for i, (ctx, ends) in zip(mine, encoded):
            spans = [(len(ctx), len(ctx) + len(end)) for end in ends]  # fit block_size
            items[i] = (packing.pack([ctx + end for end in ends], spans), examples[i]["label"])
    return packing.Prepared(items, rt, batch_size)


def evaluate(model, prepared, rt, progress=False):
    """acc and acc_norm of model (a GPT, compiled or not, DDP's module or FSDP-sharded) on the prepared
    examples (prepare), on the device and in the dtype of rt (a runtime.Runtime), by
    packing.evaluate: the context goes through the model once, not 4 times. Under torchrun the counts are
    summed over ranks (one all-reduce). Returns {"n", "acc", "acc_norm", "predictions": [(index, pred_sum,
    pred_mean) of this rank]}."""
    predictions = [p[:3] for p in packing.evaluate(model, prepared, rt, "hellaswag", progress)]
    labels = prepared.labels
    counts = torch.tensor([[1, labels[i] == by_sum, labels[i] == by_mean] for i, by_sum, by_mean in
                           predictions] + [[0, 0, 0]], device=rt.device).sum(0)
    if rt.distributed:
        torch.distributed.all_reduce(counts)
    n, correct, correct_norm = counts.tolist()
    return {"n": n, "acc": correct / n, "acc_norm": correct_norm / n, "predictions": predictions}


@torch.no_grad()
def evaluate_unbatched(model, examples, rt, progress=False):
    """The plain reference: one example (its 4 rows, no padding) per forward. Same results as evaluate()."""
    enc = get_encoding()
    predictions = []
    for i, example in enumerate(tqdm(examples, desc="hellaswag", unit="ex", disable=not progress)):
        rows, masks = render(example, enc, model.config.block_size)
        T = max(len(r) for r in rows)
        tokens = torch.tensor([r + [0] * (T - len(r)) for r in rows], device=rt.device)
        mask = torch.tensor([m + [0] * (T - len(m)) for m in masks], dtype=torch.float, device=rt.device)
        with autocast(rt.device, rt.dtype):
            logits, _ = model(tokens)
        total, mean = ending_losses(logits, tokens, mask)
        predictions.append((i, total.argmin().item(), mean.argmin().item()))
    n = len(examples)
    return {"n": n, "acc": sum(p[1] == ex["label"] for p, ex in zip(predictions, examples)) / n,
            "acc_norm": sum(p[2] == ex["label"] for p, ex in zip(predictions, examples)) / n,
            "predictions": predictions}


# ------------------------------------------------------------------------------------------------ CLI

def main():
    parser = command_line(__doc__)
    parser.add_argument("--model", default="gpt2", help="gpt2[-medium|-large|-xl], an HF GPT-2 folder, or a "
                        "train_gpt2.py checkpoint (.pt)")
    parser.add_argument("--data", "--hellaswag_data", default=None, help="hellaswag_val.jsonl or a "
                        "save_to_disk folder (default: download once into hellaswag_data/); --hellaswag_data "
                        "as train_gpt2.py names it")
    parser.add_argument("--limit", type=int, default=None, help="evaluate only the first N examples")
    parser.add_argument("--device", default="auto", help="auto (cuda, then mps, then cpu), cuda, mps or cpu")
    parser.add_argument("--batch_size", type=int, default=None,
                        help="examples per forward, a row each (default: 64 on a GPU; 8 on a CPU, where "
                        "smaller batches stay in cache and run faster)")
    parser.add_argument("--download", action="store_true", help="only download the data into hellaswag_data/ "
                        "(once): copy it to a machine without internet, and pass it with --hellaswag_data")
    parser.add_argument("--unbatched", action="store_true",
                        help="one example per forward: the slow reference")
    args = parser.parse_args()
    if args.download:
        print(f"hellaswag: {download(CACHE_DIR, '--hellaswag_data')}")
        return
    check_range("--limit", args.limit, 1)
    check_range("--batch_size", args.batch_size, 1)

    from gptlib.checkpoint import load_model
    rt = runtime.setup(args.device)  # under torchrun: its process group, each rank a GPU of its own
    if args.unbatched and rt.distributed:
        raise UserError("--unbatched runs in one process: drop torchrun, or --unbatched")
    examples = load_examples(args.data, args.limit)
    model = load_model(args.model, "--model").to(rt.device).eval()
    t0 = time.time()
    if args.unbatched:
        result, how = evaluate_unbatched(model, examples, rt, progress=True), ""
    else:
        prepared = prepare(examples, rt, args.batch_size or (64 if rt.kind == "cuda" else 8),
                            model.config.block_size)
        how = f" (tokenizing and packing {time.time() - t0:.1f} s)"
        result = evaluate(model, prepared, rt, progress=rt.master)
    dt = time.time() - t0
    if rt.master:
        print(f"hellaswag: {result['n']} examples, acc {result['acc']:.4f}, acc_norm "
              f"{result['acc_norm']:.4f}, {result['n'] / dt:.1f} examples/s, {dt:.1f} s{how}")


if __name__ == "__main__":
    main_guard(main, runtime.exit_process)
