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
import math
import os
import sys
import time

import numpy as np
import torch
from torch.nn import functional as F
from tqdm import tqdm

import runtime
from documents import iter_jsonl
from errors import UserError, check_range, command_line, first_line, main_guard
from model import Packing
from runtime import autocast, hub_online
from tokenizer import get_encoding

CACHE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hellaswag_data")
BUCKET = 8  # rows are padded to a multiple of 8 tokens
SHAPES = 8  # and to at most 8 lengths: few compiled kernels and attention plans (torch.compile turns the
# length dynamic at the second one, so it compiles twice, not per length)


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

def encode(example, enc, block_size):
    """(context tokens, [tokens of each ending]): GPT-2 tokens carry the space before a word, so an ending
    is encoded as " " + ending. The context is cropped from the left so that it and the longest ending fit
    the model's block_size positions (GPT-2's 1024 hold every example; a small model's may not); an ending
    longer than block_size is a UserError."""
    ctx = enc.encode_ordinary(example["ctx"])
    ends = [enc.encode_ordinary(" " + e) for e in example["endings"]]
    longest = max(len(end) for end in ends)
    room = block_size - longest
    if room < 0:
        raise UserError(f"a HellaSwag ending of {longest} tokens does not fit the model's block_size="
                        f"{block_size}: a larger block_size, or --hellaswag=0")
    return ctx[max(0, len(ctx) - room):], ends


def encode_all(examples, enc, block_size):
    """encode() of every example. (tiktoken's encode_ordinary_batch is 4x slower on these 50k short texts: a
    thread-pool task for each.)"""
    return [encode(ex, enc, block_size) for ex in examples]


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


def pack(ctx, ends):
    """An example (its context tokens, its 4 endings' tokens) as one row: the context once, then the 4
    endings, each at the positions it has after the context. Returns (tokens, pos, group, scored): group is
    -1 for context tokens and j for ending j; scored holds, for every ending token, (the row index of the
    token predicting it, the token, j)."""
    a = len(ctx)
    tokens, pos, group = list(ctx), list(range(a)), [-1] * a
    before, targets, owner = [], [], []
    for j, end in enumerate(ends):
        start = len(tokens)  # the row index of the ending's first token
        # its first token follows the context's last, each other token the one before it; the first token of a
        # row with no context has nothing before it and is not scored
        before += ([a - 1] if a else []) + list(range(start, start + len(end) - 1))
        targets += end if a else end[1:]
        owner += [j] * (len(end) - (not a))
        tokens += end
        pos += range(a, a + len(end))
        group += [j] * len(end)
    return tokens, pos, group, np.array([before, targets, owner], dtype=np.int64).T


def padded_lengths(longest, most=SHAPES):
    """Each batch's padded length, given its longest row (nondecreasing: the rows are sorted): multiples of
    BUCKET, at most `most` different ones, each batch padded to its group's longest, the groups of consecutive
    batches chosen to pad the fewest tokens (dynamic programming). Few shapes: few compiled kernels and
    attention plans. A group never needs to end inside a run of equal lengths (the run's rest costs nothing in
    the group it ends, and no less in the next), so the program runs over the distinct lengths (about 40),
    not the batches (thousands)."""
    m = [-(-n // BUCKET) * BUCKET for n in longest]
    values = sorted(set(m))  # nondecreasing m: each value one run
    counts = [m.count(v) for v in values]
    size = np.concatenate([[0], np.cumsum(counts)])  # batches in runs [0, k)
    tokens = np.concatenate([[0], np.cumsum([v * c for v, c in zip(values, counts)])])
    k = len(values)
    cost = [[0] + [math.inf] * k]  # cost[g][j]: the least padding of the first j runs in g groups
    start = [[0] * (k + 1)]  # where the last of those g groups starts
    for _ in range(most):
        row, first = [0] + [math.inf] * k, [0] * (k + 1)
        for j in range(1, k + 1):
            for i in range(j + 1):  # runs i .. j-1 padded to values[j-1] (i == j: an empty group)
                padding = values[j - 1] * (size[j] - size[i]) - (tokens[j] - tokens[i]) if i < j else 0
                c = cost[-1][i] + padding
                if c < row[j]:
                    row[j], first[j] = c, i
        cost.append(row)
        start.append(first)
    out, j = list(m), k
    for g in range(most, 0, -1):
        i = start[g][j]
        out[size[i]:size[j]] = [values[j - 1]] * int(size[j] - size[i])
        j = i
    return out


class Prepared:
    """HellaSwag examples as one rank's batches, tokenized and packed once (a training run prepares them
    once for all its evaluations): each example is one row (pack), rows sorted by length, batch_size rows a
    batch padded to one of at most SHAPES lengths (padded_lengths), and every rank has the same number of
    batches (under FSDP each forward is collective): a rank with fewer examples gets padding rows it does
    not count. Rank r of world_size has examples r, r + world_size, ... The arrays are in (pinned, on CUDA)
    host memory, copied to the device batch by batch without waiting."""

    def __init__(self, examples, rt, batch_size, block_size):
        self.batch_size = batch_size
        mine = list(range(rt.rank, len(examples), rt.world_size))
        encoded = encode_all([examples[i] for i in mine], get_encoding(), block_size)  # fit block_size
        packed = {i: pack(*e) for i, e in zip(mine, encoded)}
        mine.sort(key=lambda i: len(packed[i][0]))
        most = -(-len(examples) // rt.world_size)  # examples of the rank with the most
        batches = [mine[start:start + batch_size] for start in range(0, most, batch_size)]
        real = [b for b in batches if b]  # the rest: padding batches, for ranks with fewer examples
        shapes = padded_lengths([max(len(packed[i][0]) for i in b) for b in real])
        shapes += [shapes[0] if shapes else BUCKET] * (len(batches) - len(real))
        self.batches, parts, at = [], [], 0  # batches: (where its arrays are in self.data, their shapes, ids)
        for batch, L in zip(batches, shapes):
            rows = np.zeros((3, batch_size, L), dtype=np.int64)  # tokens, pos, group
            rows[2] = -2  # padding
            for b, i in enumerate(batch):
                for r, values in enumerate(packed[i][:3]):
                    rows[r, b, :len(values)] = values
            scored = [packed[i][3] + [b * L, 0, 4 * b] for b, i in enumerate(batch)]
            # a padding batch still scores a token, so its forward has the head's shapes
            scored = np.concatenate(scored) if scored else np.zeros((1, 3), dtype=np.int64)
            labels = np.array([examples[i]["label"] for i in batch] + [-1] * (batch_size - len(batch)))
            # tokens, pos, group (rows, L); select, targets, owner of the scored tokens; labels (-1: padding)
            arrays = [*rows, *scored.T, labels]
            parts += [a.ravel() for a in arrays]
            self.batches.append((at, [a.shape for a in arrays], batch))
            at += sum(a.size for a in arrays)
        self.data = torch.from_numpy(np.concatenate(parts))  # one array: one copy a batch, one pinned block
        if rt.kind == "cuda":
            self.data = self.data.pin_memory()

    def arrays(self, k, device):
        """Batch k's arrays on the device, copied from (pinned) host memory without waiting."""
        at, shapes, _ = self.batches[k]
        sizes = [math.prod(s) for s in shapes]
        flat = self.data[at:at + sum(sizes)].to(device, non_blocking=True)
        return [part.view(s) for part, s in zip(flat.split(sizes), shapes)]


def attention_mask(group):
    """(rows, L, L) from group (rows, L), on its device: a token sees the earlier tokens of the context (-1)
    and of its own ending (padding, -2, sees padding)."""
    L = group.size(1)
    keys, queries = group[:, None, :], group[:, :, None]
    causal = torch.ones(L, L, dtype=torch.bool, device=group.device).tril()
    return causal & ((keys == -1) | (keys == queries))


@torch.no_grad()
def evaluate(model, prepared, rt, progress=False):
    """acc and acc_norm of model (a GPT, compiled or not, DDP's module or FSDP-sharded) on a Prepared set of
    examples, on the device and in the dtype of rt (a runtime.Runtime).

    Each example is one row: its context once, then its 4 endings, each seeing the context and itself, so
    the context goes through the model once, not 4 times; the head and the cross-entropy run at the ending
    tokens only (select). Nothing waits for the device until the end: the batches are copied ahead, the
    masks built there, each example's two predictions stay there, and everything is read back at once.
    Under torchrun the counts are summed over ranks (one all-reduce).
    Returns {"n", "acc", "acc_norm", "predictions": [(index, pred_sum, pred_mean) of this rank]}."""
    device = rt.device
    # only a compiled model needs its shapes marked; without Dynamo loaded nothing here is compiled, and
    # importing it would cost an eager evaluation seconds
    compiled = "torch._dynamo" in sys.modules
    # per example: its label (-1: padding), the prediction by summed and by mean loss
    preds = torch.full((len(prepared.batches), prepared.batch_size, 3), -1, device=device)
    for k, (_, _, batch) in enumerate(tqdm(prepared.batches, desc="hellaswag", unit="batch",
                                           disable=not progress)):
        tokens, pos, group, select, targets, owner, labels = prepared.arrays(k, device)
        attn_mask = attention_mask(group)
        # the lengths vary from batch to batch: under torch.compile one graph for all of them, compiled once,
        # instead of one for the first length and a second, general one at the next
        for t, dims in ((tokens, (1,)), (pos, (1,)), (attn_mask, (1, 2)), (select, (0,))) if compiled else ():
            torch._dynamo.maybe_mark_dynamic(t, dims)
        with autocast(device, rt.dtype):
            logits, _ = model(tokens, packing=Packing(pos, attn_mask, select))  # (N, vocab_size)
        n = len(batch)
        if not n:  # this rank is done, but another still runs a (collective) forward
            continue
        losses = F.cross_entropy(logits.float(), targets, reduction="none")  # (N,)
        total = torch.zeros(4 * n, device=device).index_add_(0, owner, losses).view(n, 4)
        count = torch.zeros(4 * n, device=device).index_add_(0, owner, torch.ones_like(losses)).view(n, 4)
        preds[k, :n] = torch.stack([labels[:n], total.argmin(1), (total / count).argmin(1)], 1)
    real = preds[..., 0] >= 0
    counts = torch.stack([real.sum()] + [(real & (preds[..., 0] == preds[..., i])).sum() for i in (1, 2)])
    if rt.distributed:
        torch.distributed.all_reduce(counts)
    (n, correct, correct_norm), got = counts.tolist(), preds.tolist()  # the one wait for the device
    predictions = sorted((i, *got[k][b][1:]) for k, (_, _, batch) in enumerate(prepared.batches)
                         for b, i in enumerate(batch))
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
        result, how = evaluate_unbatched(model, examples, rt, progress=True), ""
    else:
        prepared = Prepared(examples, rt, args.batch_size or (64 if rt.kind == "cuda" else 8),
                            model.config.block_size)
        how = f" (tokenizing and packing {time.time() - t0:.1f} s)"
        result = evaluate(model, prepared, rt, progress=rt.master)
    dt = time.time() - t0
    if rt.master:
        print(f"hellaswag: {result['n']} examples, acc {result['acc']:.4f}, acc_norm "
              f"{result['acc_norm']:.4f}, {result['n'] / dt:.1f} examples/s, {dt:.1f} s{how}")


if __name__ == "__main__":
    main_guard(main, runtime.exit_process)
