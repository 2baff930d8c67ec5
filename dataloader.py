"""Token shards and the DDP-aware loader that reads them.

Shard file (.bin), llm.c's format so shards are interchangeable with it:
    header  256 x int32   [0] magic 20240520, [1] version 1, [2] number of tokens,
                          [3] tokens of the document at [4:6] already written (the stream position after
                              this shard, so fineweb.py resumes without re-tokenizing),
                          [4:6] that document's index (int64), [6] fingerprint of fineweb.py's arguments,
                          [7] fingerprint of its input files (names, sizes, modification times; 0: FineWeb)
    tokens  uint16 x n    GPT-2 token ids
Shards are written to a temporary name and renamed when complete: a file with a shard's name is whole.
The loader also reads build-nanogpt's shards as they are: .npy files holding one uint16 array each.
"""
import glob
import os
import re

import numpy as np

from gptlib.tokenizer import DOCUMENT_FILES, tokenize_file
from gptlib.errors import UserError, first_line

MAGIC, VERSION, HEADER_INTS = 20240520, 1, 256
HEADER_BYTES = HEADER_INTS * 4


def shard_path(out_dir, prefix, split, index):
    return os.path.join(out_dir, f"{prefix}_{split}_{index:06d}.bin")


def to_uint16(tokens, where):
    """tokens as uint16, or a clear error if an id does not fit (a plain cast would wrap it silently)."""
    tokens = np.asarray(tokens)
    if tokens.size and (tokens.min() < 0 or tokens.max() >= 2**16):
        bad = tokens.max() if tokens.max() >= 2**16 else tokens.min()
        raise UserError(f"{where}: token id {bad} does not fit in uint16; shards hold vocabularies of at "
                        "most 65,536 tokens (GPT-2 has 50,257)")
    return tokens.astype(np.uint16, copy=False)


def write_shard(path, tokens, next_doc=0, doc_offset=0, fingerprints=(0, 0)):
    """Write tokens (ids < 2**16) as a shard, atomically: a crash leaves no file under `path`."""
    tokens = to_uint16(tokens, path)
    header = np.zeros(HEADER_INTS, dtype=np.int32)
    header[:4] = MAGIC, VERSION, tokens.size, doc_offset
    header[4:6].view(np.int64)[0] = next_doc
    header[6:8] = fingerprints
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.tobytes())
        f.flush()
        os.fsync(f.fileno())  # the data is on disk before the name says "complete"
    os.replace(tmp, path)


def read_header(path):
    """The validated header of a shard (int32 array); a clear error for anything that is not a whole shard."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(HEADER_BYTES)
    except FileNotFoundError:
        raise UserError(f"shard {path} does not exist") from None
    if head.startswith(b"\x93NUMPY"):
        raise UserError(f"{path} is a .npy file (build-nanogpt's shard format) named .bin: name it .npy, "
                        f"the loader reads those")
    header = np.frombuffer(head[: len(head) // 4 * 4], dtype=np.int32)
    if header.size < HEADER_INTS or header[0] != MAGIC:
        raise UserError(f"{path} is not a token shard (bad magic number): rerun the fineweb.py command that "
                        "made it, which writes damaged shards again")
    if header[1] != VERSION:
        raise UserError(f"{path} has shard format version {header[1]}, this code reads version {VERSION}: "
                        f"re-create it with `python fineweb.py`")
    expected = HEADER_BYTES + 2 * int(header[2])
    if size != expected:
        raise UserError(f"{path} is {size:,} bytes but its header promises {expected:,} ({header[2]:,} "
                        "uint16 tokens): it is truncated or not uint16; rerun the fineweb.py command that "
                        "made it, which writes damaged shards again")
    return header


def load_shard(path):
    """The tokens of a shard (.bin, or build-nanogpt's .npy) as a read-only, memory-mapped uint16 array:
    nothing is read until used, nothing is converted."""
    if path.endswith(".npy"):
        try:
            tokens = np.load(path, mmap_mode="r")
        except FileNotFoundError:
            raise UserError(f"shard {path} does not exist") from None
        except (ValueError, OSError, EOFError) as e:  # not .npy, truncated, pickled objects
            raise UserError(f"{path} is not a readable .npy array ({first_line(e)}): rerun the script that "
                            "made it") from None
        if tokens.dtype != np.uint16 or tokens.ndim != 1:
            raise UserError(f"{path} holds a {tokens.dtype} array of shape {tokens.shape}; a token shard is "
                            "one uint16 array (as build-nanogpt's fineweb.py writes): re-create it")
        return tokens
    n = int(read_header(path)[2])
    return np.memmap(path, dtype=np.uint16, mode="r", offset=HEADER_BYTES, shape=(n,))


def split_point(n):
    """Where a corpus of n tokens that fits in one shard is cut: the first 90% trains, the rest validates. A
    data_root file and fineweb.py's one-shard corpus use it alike, so both validate on the same tokens."""
    return int(0.9 * n)


def make_shards(out_dir):
    """How to make shards in out_dir, for messages."""
    return (f"make them with `python fineweb.py --input YOUR_FILES --out_dir {out_dir}` (your own .txt, "
            f".jsonl or .parquet files) or `python fineweb.py --out_dir {out_dir}` (FineWeb-Edu, ~10B "
            "tokens)")


def missing_data_root(data_root):
    """The line for a data_root that does not exist: a file named (check the path) or a shard folder (how to
    make it)."""
    if data_root.endswith(DOCUMENT_FILES):  # a file, not a shard folder: no shards to make under its name
        return (f"data_root {data_root} does not exist: check the path (relative to the directory you run "
                "from), or point data_root at a document file that exists, such as input.txt")
    return (f"data_root {data_root} does not exist: {make_shards(data_root)}, or point data_root at a "
            ".txt, .jsonl or .parquet file such as input.txt")


def split_rows(data_root, split, T):
    """The rows of T tokens (and the next) that a split of data_root holds: DataLoaderLite's rows_total,
    from the shards' headers alone (a data_root file is tokenized once, for the loaders too)."""
    return sum(max(0, len(tokens) - 1) // T for _, tokens in DataLoaderLite.open_split(data_root, split))


def open_shards(data_root, split):
    """[(name, tokens)] of a folder's shards of the split, memory-mapped; one line for a folder of another
    kind."""
    if not os.path.isdir(data_root):
        raise UserError(missing_data_root(data_root))
    found = {ext: glob.glob(os.path.join(data_root, f"*_train_*{ext}"))
             + glob.glob(os.path.join(data_root, f"*_val_*{ext}")) for ext in (".bin", ".npy")}
    if found[".bin"] and found[".npy"]:
        names = [os.path.basename(found[ext][0]) for ext in (".bin", ".npy")]
        raise UserError(f"{data_root} holds both .bin and .npy shards ({', '.join(names)}): one dataset "
                        "per folder; move one kind elsewhere")
    ext = ".npy" if found[".npy"] else ".bin"  # build-nanogpt's shards, or ours (and llm.c's)
    sources = sorted({re.sub(r"_(train|val)_\d+\.(bin|npy)$", "", os.path.basename(p))
                      for p in found[ext]})
    if len(sources) > 1:  # two datasets' shards would both be read, as one
        raise UserError(f"{data_root} holds the shards of {len(sources)} sources "
                        f"({', '.join(sources)}_*): one dataset per folder; move the others elsewhere")
    paths = sorted(glob.glob(os.path.join(data_root, f"*_{split}_*{ext}")))
    if paths:
        return [(p, load_shard(p)) for p in paths]
    documents = [p for p in glob.glob(os.path.join(data_root, "**", "*"), recursive=True)
                 if p.endswith(DOCUMENT_FILES)]
    if documents:  # a folder of the user's own files: tokenized once by fineweb.py, not every run
        shards = os.path.normpath(data_root) + "_shards"
        raise UserError(f"{data_root} holds documents ({os.path.basename(documents[0])}, ...), not "
                        f"token shards: tokenize them once with `python fineweb.py --input {data_root} "
                        f"--out_dir {shards}`, then pass --data_root={shards}")
    raise UserError(f"no {split} shards (*_{split}_*.bin) in {data_root}: {make_shards(data_root)}")


class DataLoaderLite:
    """Batches of (x, y) int64 (B, T), y = x shifted by one token, for one rank of num_processes.

    Each shard is cut into rows of T+1 tokens that overlap by one ([j*T, j*T + T + 1)). A step takes the next
    B * num_processes rows of the shard's row order and rank r gets rows r*B .. r*B + B - 1 of them, so within
    an epoch no row is served twice across ranks and steps. The rows that do not fill a whole step (fewer than
    B * num_processes at the end of the shard) are skipped. Every rank moves to the next shard, and wraps to
    the next epoch, at the same step. Without shuffle the row order is the shard's order, so a rank's batch is
    one contiguous slice; with shuffle the shard order and the row order inside each shard are permuted,
    seeded by (seed, epoch), the same on every rank and different every epoch.

    The position (epoch, shard, next row) is the same on every rank and does not depend on B or the number
    of processes: state_dict() / load_state_dict() resume exactly, also with another B or process count.

    data_root is a directory of shards (*_{split}_*.bin, or build-nanogpt's *_{split}_*.npy) or a document
    file (.txt such as input.txt, .jsonl, .parquet), tokenized in memory as fineweb.py would and cut as its
    one-shard corpus is (split_point): the first 90% trains, the last 10% validates.
    """

    def __init__(self, B, T, process_rank=0, num_processes=1, split="train", data_root="edu_fineweb10B",
                 shuffle=False, seed=0):
        if not (all(isinstance(v, int) and v >= 1 for v in (B, T, num_processes))
                and 0 <= process_rank < num_processes and split in ("train", "val")):
            raise ValueError(f"DataLoaderLite: B={B!r} and T={T!r} must be positive integers, "
                             f"process_rank={process_rank} in [0, num_processes={num_processes}), "
                             f"split={split!r} train or val")
        self.B, self.T, self.rank, self.world, self.split = B, T, process_rank, num_processes, split
        self.shuffle, self.seed = shuffle, seed
        self.shards = self.open_split(data_root, split)  # list of (name, uint16 array)
        self.rows_per_shard = [max(0, len(tokens) - 1) // T for _, tokens in self.shards]  # an empty one: 0
        self.row_starts = np.cumsum([0] + self.rows_per_shard)  # shard k's first row in the split's rows
        self.rows_total = int(self.row_starts[-1])
        rows_per_step = B * num_processes
        # train shards shorter than a step (a corpus's tail) are passed over where the shard order reaches
        # them (_advance), not left out of it: the order, and so a saved position, does not depend on B or the
        # number of processes (validation reads rows: read_rows)
        short = [split == "train" and rows < rows_per_step for rows in self.rows_per_shard]
        if all(short):  # nothing would be left to train on
            name, tokens = self.shards[0]
            need = f"B*T*num_processes+1 = {B}*{T}*{num_processes}+1 = {B * T * num_processes + 1:,}"
            raise UserError(f"{name} holds {len(tokens):,} tokens, fewer than one step needs ({need}): lower "
                            "B or T, or make larger shards (fineweb.py --shard_size)")
        self.skipped = [(name, len(tokens)) for (name, tokens), no in zip(self.shards, short) if no]
        self.tokens_total = sum(len(tokens) for (_, tokens), no in zip(self.shards, short) if not no)
        # input tokens served per epoch: whole steps of each shard
        self.tokens_per_epoch = sum(rows // rows_per_step for rows in self.rows_per_shard) * rows_per_step * T
        self.reset()

    @staticmethod
    def open_split(data_root, split):
        """[(name, tokens)] of the split's shards (or of a data_root file's split), memory-mapped."""
        if not os.path.isfile(data_root):
            return open_shards(data_root, split)
        tokens = tokenize_file(data_root)  # a file of another kind: one line naming the kinds
        cut = split_point(len(tokens))
        return [(f"{data_root} ({split} split)", tokens[:cut] if split == "train" else tokens[cut:])]

    # -------------------------------------------------------------------------------------------- position

    def reset(self):
        self.epoch, self.shard, self.row = 0, 0, 0
        self._plan()
        if self.split == "train":  # the first shard may be shorter than a step (validation reads rows)
            self._advance()

    def state_dict(self):
        return {"epoch": self.epoch, "shard": self.shard, "row": self.row, "T": self.T, "split": self.split,
                "shuffle": self.shuffle, "seed": self.seed,
                "shards": [os.path.basename(name) for name, _ in self.shards]}

    def load_state_dict(self, state):
        mine = self.state_dict()
        old = state["shards"]
        if old != mine["shards"] and not self.shuffle and [n for n in mine["shards"] if n in old] == old:
            # written before shards shorter than a step stayed in the list (db9da80 and older): its shard
            # counts the others only
            state = {**state, "shards": mine["shards"], "shard": mine["shards"].index(old[state["shard"]])}
        for key in ("T", "split", "shuffle", "seed", "shards"):
            if state[key] != mine[key]:
                raise UserError(f"DataLoaderLite: the saved loader state has {key}={state[key]!r} but this "
                                f"loader has {key}={mine[key]!r}; an exact resume needs the same data and "
                                "sequence length")
        self.epoch, self.shard, self.row = state["epoch"], state["shard"], state["row"]
        self._plan()
        self._advance()  # with a larger B * num_processes than before, the shard's rest may not fill a step

    def _plan(self):
        """The shard order of this epoch and the row order inside the current shard."""
        n = len(self.shards)
        rng = np.random.default_rng([self.seed, self.epoch])
        self.order = rng.permutation(n) if self.shuffle else np.arange(n)
        self.current = k = int(self.order[self.shard])  # index into self.shards
        rows = self.rows_per_shard[k]
        self.rows = (np.random.default_rng([self.seed, self.epoch, k]).permutation(rows) if self.shuffle
                     else np.arange(rows))

    def _advance(self):
        """Move on to the next shard (and epoch) while the current one has fewer rows left than a step takes:
        a shard shorter than a step is passed over (__init__ checked that one is not)."""
        while self.row + self.B * self.world > len(self.rows):  # the same decision on every rank
            self.row, self.shard = 0, self.shard + 1
            if self.shard == len(self.shards):
                self.shard, self.epoch = 0, self.epoch + 1
            self._plan()

    # -------------------------------------------------------------------------------------------- batches

    def next_batch(self):
        # here, not at the top: fineweb.py uses this module's shard I/O and needs no torch (~2 s)
        import torch
        B, T = self.B, self.T
        tokens = self.shards[self.current][1]
        first = self.row + self.rank * B
        buf = np.stack([tokens[j * T: j * T + T + 1] for j in self.rows[first:first + B]]).astype(np.int64)
        x = torch.from_numpy(buf[:, :-1].copy())  # (B, T) inputs
        y = torch.from_numpy(buf[:, 1:].copy())  # (B, T) targets: the next token
        self.row += B * self.world
        self._advance()
        return x, y

    def read_rows(self, indices):
        """(x, y) int64 (len(indices), T): the split's rows with these indices in file order (shard after
        shard; whatever B, the number of processes or shuffle). Validation reads these."""
        import torch
        T, rows = self.T, []
        for g in indices:
            k = int(np.searchsorted(self.row_starts, g, side="right")) - 1  # the shard holding row g
            j = g - int(self.row_starts[k])
            rows.append(self.shards[k][1][j * T: j * T + T + 1])
        buf = np.stack(rows).astype(np.int64)
        return torch.from_numpy(buf[:, :-1].copy()), torch.from_numpy(buf[:, 1:].copy())
