"""HellaSwag evaluation (validation split, 10,042 four-way sentence completions), batched and DDP-aware.

    python hellaswag.py --model gpt2                      # OpenAI GPT-2 124M (needs internet once)
    python hellaswag.py --model log/model_019073.pt --data hellaswag_val.jsonl --limit 1000
    torchrun --nproc_per_node=8 hellaswag.py --model log/model_019073.pt

The method of the GPT-2 reproductions (OpenAI GPT-2 124M: acc_norm 0.2955; GPT-3 124M: 0.337): context
tokens = GPT-2 tokens of `ctx`, each ending = tokens of " " + ending; an ending's score is the cross-entropy
of its tokens given the context, summed (acc) or averaged over its tokens (acc_norm); the lowest loss wins.
evaluate() is the one implementation, used by this script and by train_gpt2.py.
"""
import argparse
import json
import os
import time

import torch
from torch.nn import functional as F
from tqdm import tqdm

from dataloader import iter_jsonl
from runtime import autocast, first_line, one_line_errors, pick_device
from tokenizer import get_encoding

CACHE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hellaswag_data")
BUCKET = 8  # rows are padded to a multiple of 8 tokens: 13% padding on HellaSwag, 18 lengths (torch.compile
# turns the length dynamic at the second one, so it compiles twice, not per example)


# ------------------------------------------------------------------------------------------------ data

def normalize(example, where):
    """The fields we use, checked: ctx (str), endings (4 str), label (int 0-3; the HF copy has it as str)."""
    try:
        ctx, endings, label = example["ctx"], list(example["endings"]), int(example["label"])
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{where}: not a HellaSwag example (needs ctx, endings and an integer "
                         f"label): {e!r}") from None
    if not isinstance(ctx, str) or len(endings) != 4 or not all(isinstance(e, str) for e in endings) \
            or not 0 <= label < 4:
        raise ValueError(f"{where}: not a HellaSwag example (ctx must be a string, endings 4 strings, label "
                         "0-3)")
    return {"ctx": ctx, "endings": endings, "label": label}


def download(cache_dir):
    """The validation split as jsonl in cache_dir, downloaded once. Every process may call this at the same
    time (all DDP ranks do): an exclusive file lock lets the first download while the others wait, then
    they all read the finished file. The file is written under a temporary name and renamed when complete."""
    import fcntl
    path = os.path.join(cache_dir, "hellaswag_val.jsonl")
    os.makedirs(cache_dir, exist_ok=True)
    with open(path + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also if this process dies
        if not os.path.exists(path):
            print(f"hellaswag: downloading Rowan/hellaswag (validation) to {path}")
            try:
                from datasets import load_dataset
                ds = load_dataset("Rowan/hellaswag", split="validation")
            except Exception as e:  # offline, no datasets package, Hub outage: the same way out
                raise OSError(f"could not download HellaSwag ({first_line(e)}); offline, pass a local copy "
                              "of hellaswag_val.jsonl (github.com/rowanz/hellaswag) with --data") from None
            with open(path + ".tmp", "w", encoding="utf-8") as f:
                for i, row in enumerate(ds):
                    f.write(json.dumps(normalize(row, f"Rowan/hellaswag validation row {i}")) + "\n")
            os.replace(path + ".tmp", path)
    return path


def load_examples(path=None, limit=None, cache_dir=CACHE_DIR):
    """HellaSwag validation examples from a .jsonl file or a datasets.save_to_disk folder (offline), or,
    with path None, downloaded into cache_dir once. limit keeps the first N."""
    if path is None:
        path = download(cache_dir)
    if os.path.isdir(path):
        from datasets import DatasetDict, load_from_disk
        ds = load_from_disk(path)
        if isinstance(ds, DatasetDict):
            ds = ds["validation"]
        examples = [normalize(row, f"{path} row {i}") for i, row in enumerate(ds)]
    elif os.path.isfile(path):
        examples = [normalize(row, where) for where, row in iter_jsonl(path)]
    else:
        raise FileNotFoundError(f"HellaSwag data {path} does not exist: pass a .jsonl file or save_to_disk "
                                "folder, or leave --data out to download it")
    examples = examples[:limit] if limit is not None else examples
    if not examples:
        raise ValueError(f"no HellaSwag examples selected from {path} (limit={limit})")
    return examples


# ------------------------------------------------------------------------------------------------ scoring

def render(example, enc):
    """Token rows context + ending for the 4 endings, and masks marking each row's ending tokens."""
    ctx = enc.encode_ordinary(example["ctx"])
    rows, masks = [], []
    for ending in example["endings"]:
        end = enc.encode_ordinary(" " + ending)  # GPT-2 tokens carry the space before a word
        rows.append(ctx + end)
        masks.append([0] * len(ctx) + [1] * len(end))
    return rows, masks


def ending_losses(logits, tokens, mask):
    """Per row, the summed and the mean cross-entropy of the masked (ending) tokens. logits (N, T, V).
    Only the ending positions are upcast to float32 and scored, not the whole (N, T, V) tensor."""
    keep = mask[:, 1:].bool()  # position t predicts token t+1
    losses = torch.zeros(keep.shape, device=logits.device)
    losses[keep] = F.cross_entropy(logits[:, :-1][keep].float(), tokens[:, 1:][keep], reduction="none")
    total = losses.sum(1)
    return total, total / keep.sum(1)


@torch.no_grad()
def evaluate(model, examples, device, batch_size=16, rank=0, world_size=1, progress=False, dtype="auto"):
    """acc and acc_norm of model (a callable idx -> (logits, loss), compiled or not) on examples.

    Rank r of world_size scores examples r, r + world_size, ...; with torch.distributed initialised the
    counts are summed over ranks (one all-reduce at the end). Every rank runs the same number of forwards
    (under FSDP each one is collective): a rank with fewer examples runs a padding batch it does not count.
    Examples go batch_size at a time, sorted by length, padded to (4 * batch_size, multiple of 8 tokens).
    Returns {"n", "acc", "acc_norm", "predictions": [(index, pred_sum, pred_mean) of this rank]}."""
    enc = get_encoding()
    mine = [(i, render(examples[i], enc), examples[i]["label"])
            for i in range(rank, len(examples), world_size)]
    mine.sort(key=lambda item: max(len(r) for r in item[1][0]))
    predictions = []
    counts = torch.zeros(3, dtype=torch.long, device=device)  # n, correct (sum), correct (mean)
    most = -(-len(examples) // world_size)  # examples of the rank with the most
    for start in tqdm(range(0, most, batch_size), desc="hellaswag", unit="batch", disable=not progress):
        batch = mine[start:start + batch_size]
        if not batch:  # this rank is done, but another still runs a (collective) forward
            with autocast(device, dtype):
                model(torch.zeros(4 * batch_size, BUCKET, dtype=torch.long, device=device))
            continue
        longest = max(len(r) for _, (rows, _), _ in batch for r in rows)
        T = -(-longest // BUCKET) * BUCKET
        tokens = torch.zeros(4 * batch_size, T, dtype=torch.long)  # unused rows and tails are padding
        mask = torch.zeros(4 * batch_size, T)
        for b, (_, (rows, masks), _) in enumerate(batch):
            for j in range(4):
                tokens[4 * b + j, :len(rows[j])] = torch.tensor(rows[j])
                mask[4 * b + j, :len(masks[j])] = torch.tensor(masks[j], dtype=torch.float)
        tokens, mask = tokens.to(device), mask.to(device)
        with autocast(device, dtype):
            logits, _ = model(tokens)
        total, mean = ending_losses(logits, tokens, mask)
        n = len(batch)
        pred_sum = total[:4 * n].view(n, 4).argmin(1)  # padding rows (0 / 0 = nan) are left out
        pred_mean = mean[:4 * n].view(n, 4).argmin(1)
        labels = torch.tensor([label for _, _, label in batch], device=device)
        counts += torch.stack([torch.tensor(n, device=device), (pred_sum == labels).sum(),
                               (pred_mean == labels).sum()])
        predictions += zip([i for i, _, _ in batch], pred_sum.tolist(), pred_mean.tolist())
    if world_size > 1 and torch.distributed.is_initialized():
        torch.distributed.all_reduce(counts)
    n, correct, correct_norm = counts.tolist()
    return {"n": n, "acc": correct / n, "acc_norm": correct_norm / n, "predictions": sorted(predictions)}


@torch.no_grad()
def evaluate_unbatched(model, examples, device, progress=False, dtype="auto"):
    """The plain reference: one example (its 4 rows, no padding) per forward. Same results as evaluate()."""
    enc = get_encoding()
    predictions = []
    for i, example in enumerate(tqdm(examples, desc="hellaswag", unit="ex", disable=not progress)):
        rows, masks = render(example, enc)
        T = max(len(r) for r in rows)
        tokens = torch.tensor([r + [0] * (T - len(r)) for r in rows], device=device)
        mask = torch.tensor([m + [0] * (T - len(m)) for m in masks], dtype=torch.float, device=device)
        with autocast(device, dtype):
            logits, _ = model(tokens)
        total, mean = ending_losses(logits, tokens, mask)
        predictions.append((i, total.argmin().item(), mean.argmin().item()))
    n = len(examples)
    return {"n": n, "acc": sum(p[1] == ex["label"] for p, ex in zip(predictions, examples)) / n,
            "acc_norm": sum(p[2] == ex["label"] for p, ex in zip(predictions, examples)) / n,
            "predictions": predictions}


# ------------------------------------------------------------------------------------------------ CLI

def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="gpt2", help="gpt2[-medium|-large|-xl], an HF GPT-2 folder, or a "
                        "train_gpt2.py checkpoint (.pt)")
    parser.add_argument("--data", default=None, help="hellaswag_val.jsonl or a save_to_disk folder "
                        "(default: download once into hellaswag_data/)")
    parser.add_argument("--limit", type=int, default=None, help="evaluate only the first N examples")
    parser.add_argument("--device", default="auto", help="auto (cuda, then mps, then cpu), cuda, mps or cpu")
    parser.add_argument("--batch_size", type=int, default=16, help="examples per forward (4 rows each)")
    parser.add_argument("--unbatched", action="store_true",
                        help="one example per forward: the slow reference")
    args = parser.parse_args()
    if args.batch_size < 1:
        parser.error(f"--batch_size={args.batch_size} must be >= 1")

    from checkpoint import load_model
    rank, world_size = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    with one_line_errors():
        device = pick_device(args.device)
    if world_size > 1:  # launched by torchrun
        import torch.distributed as dist
        if device.startswith("cuda"):
            device = f"cuda:{int(os.environ['LOCAL_RANK'])}"
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.startswith("cuda") else "gloo")
    with one_line_errors():  # a missing or damaged file, no network
        examples = load_examples(args.data, args.limit)
        model = load_model(args.model).to(device).eval()
    if device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = True

    t0 = time.time()
    if args.unbatched:
        if world_size > 1:
            parser.error("--unbatched runs in one process")
        result = evaluate_unbatched(model, examples, device, progress=True)
    else:
        result = evaluate(model, examples, device, args.batch_size, rank, world_size, progress=rank == 0)
    dt = time.time() - t0
    if rank == 0:
        print(f"hellaswag: {result['n']} examples, acc {result['acc']:.4f}, acc_norm "
              f"{result['acc_norm']:.4f}, {result['n'] / dt:.1f} examples/s")
    if world_size > 1:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
