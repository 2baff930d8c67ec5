"""Scoring continuations fast: the one packed evaluation of HellaSwag (hellaswag.py) and CORE (core_eval.py).

An item is a few token sequences (the options of a question) and, in each, the span of tokens to score. All of
an item's sequences go into one row: their common prefix once (the context, and the few-shot examples before
it), then each sequence's rest, each seeing the prefix and itself (a mask; positions as if alone), so a
10-shot prompt runs through the model once, not once per option. The head and the cross-entropy run at the
scored tokens only. Rows are sorted by length and padded to a few shapes; every rank runs the same number of
batches (under FSDP each forward is collective); nothing is read back until the end.
"""
import math
import sys

import numpy as np
import torch
from torch.nn import functional as F
from tqdm import tqdm

from gptlib.runtime import autocast, sharded, together
from model import Packing

BUCKET = 8  # rows are padded to a multiple of 8 tokens
SHAPES = 8  # and to at most 8 lengths: few compiled kernels and attention plans (torch.compile turns the
# length dynamic at the second one, so it compiles twice, not per length)


def common_prefix(sequences):
    """The length of the token prefix all sequences (numpy arrays) share."""
    n, first = min(len(s) for s in sequences), sequences[0]
    for seq in sequences[1:]:
        same = seq[:n] == first[:n]
        if not same.all():
            n = int(same.argmin())  # the first difference
    return n


def pack(sequences, spans):
    """An item as one row: the sequences' common prefix once, then each one's rest at the positions it has
    after the prefix. sequences: token lists or (int64) arrays; spans: (start, end) of each sequence's scored
    tokens. Returns (rows, scored, n): rows (3, length), the row's tokens, positions and group (-1 for prefix
    tokens, j for the rest of sequence j); scored holds, for every scored token, (the row index of the token
    predicting it, the token, j); n the number of sequences. A sequence's first token has nothing before it
    and is never scored. (Two loops, the second filling scored from the row: stacking each sequence's
    measured 30% slower.)"""
    sequences = [np.asarray(s, dtype=np.int64) for s in sequences]
    a, k = common_prefix(sequences), len(sequences)
    rows = np.empty((3, a + sum(len(s) - a for s in sequences)), dtype=np.int64)  # tokens, pos, group
    rows[0] = np.concatenate([sequences[0][:a]] + [s[a:] for s in sequences])
    rows[1, :a], rows[2, :a] = np.arange(a), -1
    spans_at, at = [], a  # at: the row index where sequence j's rest begins
    for j, (seq, (start, end)) in enumerate(zip(sequences, spans)):
        n = len(seq) - a
        rows[1, at:at + n], rows[2, at:at + n] = np.arange(a, a + n), j
        lo = max(start, 1) - 1
        r = np.arange(lo, max(end, 1))  # the positions predicting, and the last scored one
        r[max(a - lo, 0):] += at - a  # their row indices: those past the prefix are in j's rest
        spans_at.append(r)
        at += n
    scored, at = np.empty((sum(len(r) - 1 for r in spans_at), 3), dtype=np.int64), 0
    for j, r in enumerate(spans_at):  # (row index predicting, the token it predicts, j)
        scored[at:at + len(r) - 1, 0], scored[at:at + len(r) - 1, 1], scored[at:at + len(r) - 1, 2] = \
            r[:-1], rows[0, r[1:]], j
        at += len(r) - 1
    return rows, scored, k


def padded_lengths(longest, most=SHAPES):
    """Each batch's padded length, given its longest row (nondecreasing: the rows are sorted): multiples of
    BUCKET, at most `most` different ones, each batch padded to its group's longest, the groups of consecutive
    batches chosen to pad the fewest tokens (dynamic programming). A group never needs to end inside a run of
    equal lengths, so the program runs over the distinct lengths (tens), not the batches (thousands)."""
    m = [-(-n // BUCKET) * BUCKET for n in longest]
    if not m:  # a rank with no items (fewer items than ranks)
        return []
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
    """Items as one rank's batches, packed once (a training run prepares them once for all its evaluations):
    items[i] = (pack()'s row, label), label the right option's index (kept in labels, for the caller; None: a
    language-modelling item, judged by its greedy tokens), or None where another rank's (only rank r's need be
    made): rank r of world_size has items r, r + world_size, ... (a task's items are consecutive, so each rank
    gets its share of every task: as many 10-shot items as any other rank, not the 10-shot task while another
    gets the 0-shot one). Rows sorted by length, batch_size rows a batch padded to one of at most SHAPES
    lengths (padded_lengths), and every rank has the same number of batches: a rank with fewer items gets
    padding rows it does not count. width: the most sequences of an item. The arrays are in (pinned, on CUDA)
    host memory, copied to the device batch by batch without waiting."""

    def __init__(self, items, rt, batch_size):
        mine = list(range(rt.rank, len(items), rt.world_size))
        self.batch_size, self.width = batch_size, max((items[i][0][2] for i in mine), default=1)
        self.labels = {i: items[i][1] for i in mine}
        length = {i: items[i][0][0].shape[1] for i in mine}
        mine.sort(key=length.get)
        most = -(-len(items) // rt.world_size)  # items of the rank with the most
        batches = [mine[start:start + batch_size] for start in range(0, most, batch_size)]
        real = [b for b in batches if b]  # the rest: padding batches, for ranks with fewer items
        shapes = padded_lengths([max(length[i] for i in b) for b in real])
        shapes += [shapes[0] if shapes else BUCKET] * (len(batches) - len(real))
        self.batches, parts, at = [], [], 0  # batches: (where its arrays are in self.data, their shapes, ids)
        self.greedy = [any(self.labels[i] is None for i in b) for b in batches]  # batches that need argmaxes
        for batch, L in zip(batches, shapes):
            rows = np.zeros((3, batch_size, L), dtype=np.int64)  # tokens, pos, group
            rows[2] = -2  # padding
            for b, i in enumerate(batch):
                rows[:, b, :length[i]] = items[i][0][0]
            scored = np.concatenate([items[i][0][1] for i in batch] + [np.zeros((0, 3), dtype=np.int64)])
            # row b's scored tokens: its index into the (rows * L) tokens, and its options after row b-1's
            scored += np.repeat(np.arange(len(batch))[:, None] * [L, 0, self.width],
                                [len(items[i][0][1]) for i in batch], axis=0)
            if not len(scored):  # a padding batch still scores a token, so its forward has the head's shapes
                scored = np.zeros((1, 3), dtype=np.int64)
            # tokens, pos, group (rows, L); select, targets, owner of the scored tokens
            arrays = [*rows, *scored.T]
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
    """(rows, L, L) from group (rows, L), on its device: a token sees the earlier tokens of the prefix (-1)
    and of its own sequence (padding, -2, sees padding)."""
    L = group.size(1)
    keys, queries = group[:, None, :], group[:, :, None]
    causal = torch.ones(L, L, dtype=torch.bool, device=group.device).tril()
    return causal & ((keys == -1) | (keys == queries))


@torch.no_grad()
def evaluate(model, prepared, rt, desc="eval", progress=False):
    """[(item index, by summed loss, by mean loss, greedy)] of this rank's items, sorted by index: the option
    whose scored tokens have the lowest summed and the lowest mean cross-entropy, and whether the first
    sequence's scored tokens are each the model's argmax (a language-modelling item's answer). model: a GPT,
    compiled or not, DDP's module or FSDP-sharded; the device and dtype of rt (a runtime.Runtime). Every rank
    must call it (one forward per batch, the same number on each); a failure on any rank is every rank's at
    its end (runtime.together), before the callers' collectives."""
    with together(rt, guard=not sharded(model)):
        got = predict(model, prepared, rt, desc, progress)
    return sorted((i, *got[k][b]) for k, (_, _, batch) in enumerate(prepared.batches)
                  for b, i in enumerate(batch))


def predict(model, prepared, rt, desc, progress):
    """evaluate()'s forwards: [batch][row] = [by summed loss, by mean loss, greedy] (-1 for padding rows)."""
    device, width = rt.device, prepared.width
    # only a compiled model needs its shapes marked; without Dynamo loaded nothing here is compiled, and
    # importing it would cost an eager evaluation seconds
    compiled = "torch._dynamo" in sys.modules
    preds = torch.full((len(prepared.batches), prepared.batch_size, 3), -1, device=device)
    # a terminal's bar moves as usual; a redirected log gets a line every 30 s, not one per batch
    bar = tqdm(prepared.batches, desc=desc, unit="batch", disable=not progress,
               mininterval=0.1 if sys.stderr.isatty() else 30)
    for k, (_, _, batch) in enumerate(bar):
        tokens, pos, group, select, targets, owner = prepared.arrays(k, device)
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
        # (N,) not the greedy token: below the row's largest logit (amax: 10x cheaper than argmax on a CPU;
        # only an exact tie with an earlier id would be judged otherwise)
        missed = (logits.gather(1, targets[:, None]).squeeze(1) < logits.amax(-1)).float() \
            if prepared.greedy[k] else torch.zeros_like(losses)
        sums = torch.zeros(3, n * width, device=device)
        for row, values in enumerate((losses, torch.ones_like(losses), missed)):
            sums[row].index_add_(0, owner, values)
        total, count, missed = sums.view(3, n, width)
        total = total.masked_fill(count == 0, math.inf)  # no such option (fewer than width), or none scored
        # by mean loss, an option 0 with no scored tokens wins, as in nanochat (core_eval.encode)
        by_mean = torch.where(count[:, 0] == 0, 0, (total / count).argmin(1))
        preds[k, :n] = torch.stack([total.argmin(1), by_mean, (missed[:, 0] == 0).long()], 1)
    return preds.tolist()  # the one wait for the device
