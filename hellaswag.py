"""HellaSwag evaluation (validation split, 10,042 four-way sentence completions), batched and DDP-aware.

    python hellaswag.py --model gpt2                      # OpenAI GPT-2 124M (needs internet once)
    python hellaswag.py --model log/model_019073.pt --data hellaswag_val.jsonl --limit 1000
    torchrun --nproc_per_node=8 hellaswag.py --model log/model_019073.pt

The method of the GPT-2 reproductions (OpenAI GPT-2 124M: acc_norm 0.2955; GPT-3 124M: 0.337): context
tokens = GPT-2 tokens of `ctx`, each ending = tokens of " " + ending; an ending's score is the cross-entropy
of its tokens given the context, summed (acc) or averaged over its tokens (acc_norm); the lowest loss wins.
evaluate() is the one implementation, used by this script and by train_gpt2.py.
"""
import json
import os
import sys
import time

import numpy as np
import torch
from torch.nn import functional as F
from tqdm import tqdm

import runtime
from dataloader import iter_jsonl
from errors import UserError, check_range, command_line, first_line
from runtime import autocast, hub_online
from tokenizer import get_encoding

CACHE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hellaswag_data")
BUCKET = 8  # rows are padded to a multiple of 8 tokens: few lengths (torch.compile turns the length
# dynamic at the second one, so it compiles twice, not per example)


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
    try:
        from filelock import FileLock  # comes with datasets; unlike fcntl it works on Windows too
    except ImportError:
        raise UserError("downloading HellaSwag needs the datasets package (pip install datasets); offline, "
                        f"pass a local copy of hellaswag_val.jsonl with {option}") from None
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
    if path is None:
        path = download(cache_dir, option)
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
    examples = examples[:limit] if limit is not None else examples
    if not examples:
        raise UserError(f"no HellaSwag examples selected from {path} (limit={limit})")
    return examples


# ------------------------------------------------------------------------------------------------ scoring

def encode(example, enc):
    """(context tokens, [tokens of each ending]): GPT-2 tokens carry the space before a word, so an ending
    is encoded as " " + ending."""
    return enc.encode_ordinary(example["ctx"]), [enc.encode_ordinary(" " + e) for e in example["endings"]]


def render(example, enc):
    """Token rows context + ending for the 4 endings, and masks marking each row's ending tokens."""
    ctx, ends = encode(example, enc)
    return [ctx + end for end in ends], [[0] * len(ctx) + [1] * len(end) for end in ends]


def ending_losses(logits, tokens, mask):
    """Per row, the summed and the mean cross-entropy of the masked (ending) tokens. logits (N, T, V).
    Only the ending positions are upcast to float32 and scored, not the whole (N, T, V) tensor."""
    keep = mask[:, 1:].bool()  # position t predicts token t+1
    losses = torch.zeros(keep.shape, device=logits.device)
    losses[keep] = F.cross_entropy(logits[:, :-1][keep].float(), tokens[:, 1:][keep], reduction="none")
    total = losses.sum(1)
    return total, total / keep.sum(1)


def pack(example, enc):
    """An example as one row: its context once, then its 4 endings, each at the positions it has after the
    context. Returns (tokens, pos, group, scored): group is -1 for context tokens and j for ending j;
    scored holds, for every ending token, (the row index of the token predicting it, the token, j)."""
    ctx, ends = encode(example, enc)
    tokens, pos, group, scored = list(ctx), list(range(len(ctx))), [-1] * len(ctx), []
    for j, end in enumerate(ends):
        for k, token in enumerate(end):
            if k or ctx:  # the first ending token follows the context's last; a row's first token has none
                scored.append((len(tokens) - 1 if k else len(ctx) - 1, token, j))
            tokens.append(token)
            pos.append(len(ctx) + k)
            group.append(j)
    return tokens, pos, group, np.array(scored, dtype=np.int64).reshape(-1, 3)


def collate(packed, rows, device):
    """A forward's inputs for packed examples, padded to `rows` rows of a multiple of BUCKET tokens:
    tokens and pos (rows, L); attn_mask (rows, L, L): a token sees the earlier tokens of its context and of
    its own ending (padding sees padding); select (N,): the flat positions whose next token is scored;
    targets (N,); owner (N,): the ending (4 * example + j) each scored token belongs to."""
    L = -(-max(len(p[0]) for p in packed) // BUCKET) * BUCKET
    tokens, pos = torch.zeros(rows, L, dtype=torch.long), torch.zeros(rows, L, dtype=torch.long)
    group = torch.full((rows, L), -2)
    for b, (t, p, g, _) in enumerate(packed):
        tokens[b, :len(t)], pos[b, :len(t)], group[b, :len(t)] = map(torch.tensor, (t, p, g))
    keys, queries = group[:, None, :], group[:, :, None]
    attn_mask = torch.ones(L, L, dtype=torch.bool).tril() & ((keys == -1) | (keys == queries))
    scored = np.concatenate([s + [b * L, 0, 4 * b] for b, (_, _, _, s) in enumerate(packed)])
    select, targets, owner = torch.from_numpy(scored).to(device).unbind(1)
    return tokens.to(device), pos.to(device), attn_mask.to(device), select, targets, owner


@torch.no_grad()
def evaluate(model, examples, rt, batch_size=16, progress=False):
    """acc and acc_norm of model (a GPT, compiled or not, DDP's module or FSDP-sharded) on examples, on the
    device and in the dtype of rt (a runtime.Runtime).

    Each example is one row: its context once, then its 4 endings, each seeing the context and itself
    (pack), so the context goes through the model once, not 4 times; the head and the cross-entropy run at
    the ending tokens only (select). batch_size examples a forward, sorted by length, padded to (batch_size,
    multiple of 8 tokens). Rank r of world_size scores examples r, r + world_size, ...; under torchrun the
    counts are summed over ranks (one all-reduce at the end). Every rank
    runs the same number of forwards (under FSDP each one is collective): a rank with fewer examples runs a
    padding batch it does not count.
    Returns {"n", "acc", "acc_norm", "predictions": [(index, pred_sum, pred_mean) of this rank]}."""
    enc, device = get_encoding(), rt.device
    mine = [(i, pack(examples[i], enc), examples[i]["label"])
            for i in range(rt.rank, len(examples), rt.world_size)]
    mine.sort(key=lambda item: len(item[1][0]))
    pad = ([0] * BUCKET, [0] * BUCKET, [-2] * BUCKET, np.zeros((2, 3), dtype=np.int64))  # scores 2 tokens
    predictions = []
    counts = torch.zeros(3, dtype=torch.long, device=device)  # n, correct (sum), correct (mean)
    most = -(-len(examples) // rt.world_size)  # examples of the rank with the most
    for start in tqdm(range(0, most, batch_size), desc="hellaswag", unit="batch", disable=not progress):
        batch = mine[start:start + batch_size]
        packed = [p for _, p, _ in batch] or [pad]
        tokens, pos, attn_mask, select, targets, owner = collate(packed, batch_size, device)
        # the lengths vary from batch to batch: under torch.compile one graph for all of them, compiled once,
        # instead of one for the first length and a second, general one at the next (eager: no effect)
        for t, dims in ((tokens, (1,)), (pos, (1,)), (attn_mask, (1, 2)), (select, (0,))):
            torch._dynamo.maybe_mark_dynamic(t, dims)
        with autocast(device, rt.dtype):
            logits, _ = model(tokens, pos=pos, attn_mask=attn_mask, select=select)  # (N, vocab_size)
        if not batch:  # this rank is done, but another still runs a (collective) forward
            continue
        n = len(batch)
        losses = F.cross_entropy(logits.float(), targets, reduction="none")  # (N,)
        total = torch.zeros(4 * n, device=device).index_add_(0, owner, losses).view(n, 4)
        mean = total / torch.bincount(owner, minlength=4 * n).view(n, 4)
        pred_sum, pred_mean = total.argmin(1), mean.argmin(1)
        labels = torch.tensor([label for _, _, label in batch], device=device)
        counts += torch.stack([torch.tensor(n, device=device), (pred_sum == labels).sum(),
                               (pred_mean == labels).sum()])
        predictions += zip([i for i, _, _ in batch], pred_sum.tolist(), pred_mean.tolist())
    if rt.distributed:
        torch.distributed.all_reduce(counts)
    n, correct, correct_norm = counts.tolist()
    return {"n": n, "acc": correct / n, "acc_norm": correct_norm / n, "predictions": sorted(predictions)}


@torch.no_grad()
def evaluate_unbatched(model, examples, rt, progress=False):
    """The plain reference: one example (its 4 rows, no padding) per forward. Same results as evaluate()."""
    enc = get_encoding()
    predictions = []
    for i, example in enumerate(tqdm(examples, desc="hellaswag", unit="ex", disable=not progress)):
        rows, masks = render(example, enc)
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
    parser.add_argument("--data", default=None, help="hellaswag_val.jsonl or a save_to_disk folder "
                        "(default: download once into hellaswag_data/)")
    parser.add_argument("--limit", type=int, default=None, help="evaluate only the first N examples")
    parser.add_argument("--device", default="auto", help="auto (cuda, then mps, then cpu), cuda, mps or cpu")
    parser.add_argument("--batch_size", type=int, default=None,
                        help="examples per forward, a row each (default: 64 on a GPU; 8 on a CPU, where "
                        "smaller batches stay in cache and run faster)")
    parser.add_argument("--unbatched", action="store_true",
                        help="one example per forward: the slow reference")
    args = parser.parse_args()
    check_range("--limit", args.limit, 1)
    check_range("--batch_size", args.batch_size, 1)

    from checkpoint import load_model
    rt = runtime.setup(args.device)  # under torchrun: its process group, each rank a GPU of its own
    if args.unbatched and rt.distributed:
        raise UserError("--unbatched runs in one process: drop torchrun, or --unbatched")
    examples = load_examples(args.data, args.limit)
    model = load_model(args.model).to(rt.device).eval()
    t0 = time.time()
    if args.unbatched:
        result = evaluate_unbatched(model, examples, rt, progress=True)
    else:
        batch_size = args.batch_size or (64 if rt.kind == "cuda" else 8)
        result = evaluate(model, examples, rt, batch_size, progress=rt.master)
    dt = time.time() - t0
    if rt.master:
        print(f"hellaswag: {result['n']} examples, acc {result['acc']:.4f}, acc_norm "
              f"{result['acc_norm']:.4f}, {result['n'] / dt:.1f} examples/s")
    if rt.distributed:
        runtime.exit_process(0)  # every rank, after the last collective: also takes the process group down


if __name__ == "__main__":
    try:
        main()
    except UserError as e:  # the same on every rank: said once per node
        if os.environ.get("LOCAL_RANK", "0") == "0":
            print(f"error: {e}", file=sys.stderr)
        runtime.exit_process(1, wait=False)
