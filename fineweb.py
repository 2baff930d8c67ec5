"""FineWeb-Edu -> GPT-2 token shards for train_gpt2.py.

    python fineweb.py                               # FineWeb-Edu sample-10BT: ~10B tokens, ~100 shards
    python fineweb.py --input data/ --out_dir mine  # local .jsonl / .parquet / .txt files, save_to_disk dir
    python fineweb.py --pretokenized                # download the same 10B tokens already tokenized: minutes
    python fineweb.py --pretokenized --shards 10    # the val shard and the first 10 train shards (1B tokens)
    python fineweb.py --speedrun_val                # the speedruns' FineWeb val shard, into fineweb10B_val/

Every document becomes <|endoftext|> followed by its GPT-2 tokens; documents keep their input order, so the
output is deterministic. The token stream's first 16,777,216 tokens (VAL_TOKENS, or one shard if
--shard_size is smaller) are the validation split ({prefix}_val_000000.bin), the rest train in shards of
--shard_size tokens ({prefix}_train_000001.bin, ...; a document may span two, the last may be short); the
prefix is edufineweb for FineWeb-Edu and corpus for --input's files, unless --prefix names one. A corpus
within one shard is cut as a data_root file is: the first 90% trains, the last 10% validates. Each shard is
written under a temporary name and renamed when complete. A rerun with the same arguments skips the complete
shards (their headers record where in the document stream they end) and writes byte-identical files; a rerun
with other arguments, or after the input files changed (names, sizes, modification times), is refused.

--pretokenized downloads FineWeb-Edu 10B as modded-nanogpt's cached_finewebedu10B.py does: the Hugging Face
dataset kjj0/finewebedu10B-gpt2, already tokenized with GPT-2's BPE in llm.c's shard layout (which the loader
reads), 100M tokens a shard. It is another snapshot than tokenizing sample-10BT yourself, with another
validation shard: compare runs on the same one.

--speedrun_val downloads the speedruns' yardstick: fineweb_val_000000.bin (100M tokens) of
kjj0/fineweb10B-gpt2, FineWeb's (not FineWeb-Edu's) validation tokens, as modded-nanogpt's
cached_fineweb10B.py does. modded-nanogpt trains to val loss 3.28 there; OpenAI's GPT-2 124M scores 3.425
(llm.c). A checkpoint is scored on its first 10,485,760 tokens, as the speedruns do, by `python train_gpt2.py
--eval_only=True --init_from=log/model_019073.pt --data_root=fineweb10B_val --val_tokens=10485760
--log_dir=eval_fw`.
"""
import collections
import glob
import itertools
import json
import os
import shutil
import sys
import threading
import time
import zlib
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from dataloader import read_header, shard_path, split_point, to_uint16, write_shard
from gptlib.tokenizer import DOCUMENT_FILES, field, iter_file, text_of
from gptlib.errors import UserError, check_range, command_line, first_line, main_guard

REMOTE, REMOTE_CONFIG = "HuggingFaceFW/fineweb-edu", "sample-10BT"
# the validation shard of a corpus larger than one shard: its first VAL_TOKENS (or one shard, if smaller):
# more than the default run evaluates (val_tokens = 10,485,760), a small share of any corpus past one shard
# (a 150M one keeps 89% to train, not 33%), whatever --shard_size is
VAL_TOKENS = 2**24
FINEWEB_PREFIX, INPUT_PREFIX = "edufineweb", "corpus"  # the shards' names: tokenized FineWeb-Edu, --input's
PRETOKENIZED, PRETOKENIZED_PREFIX = "kjj0/finewebedu10B-gpt2", "finewebedu"
SPEEDRUN, SPEEDRUN_PREFIX = "kjj0/fineweb10B-gpt2", "fineweb"  # --speedrun_val: its val shard only
# its train shards: finewebedu_train_000001.bin ... _000099.bin, 100M tokens each but the last (53,989,344):
# 9,853,989,344 tokens (103 is kjj0/fineweb10B-gpt2's count, not this dataset's)
PRETOKENIZED_TRAIN = 99
EMPTY = object()  # what next() gives for a corpus without documents


# ------------------------------------------------------------------------------------------------ reading

def iter_documents(input_path, text_field, listing):
    """The documents' texts in order: local files (offline; listing: their input_files) or, without
    input_path, FineWeb-Edu streamed from the Hugging Face Hub (no 28 GB download to disk first)."""
    if input_path is None:
        try:
            from datasets import load_dataset
            from huggingface_hub.utils import logging
            logging.set_verbosity_error()  # no retry chatter: one line below says what went wrong
            ds = load_dataset(REMOTE, name=REMOTE_CONFIG, split="train", streaming=True)
        except Exception as e:  # offline, no datasets package, Hub outage: the same way out
            raise UserError(f"could not stream {REMOTE} ({REMOTE_CONFIG}) from the Hugging Face Hub "
                            f"({first_line(e)}); offline, --input takes local data: .jsonl/.parquet/.txt "
                            "files, a folder of them, or a datasets.save_to_disk folder") from None
        return (field(row, text_field, REMOTE) for row in ds)
    kind, files, others = listing
    if kind == "saved":
        return iter_saved_dataset(input_path, text_field)
    if others:
        print(f"fineweb: reading the {len(files)} {', '.join(DOCUMENT_FILES)} files in {input_path}, "
              f"skipping {len(others)} other files ({os.path.relpath(others[0], input_path)}, ...)")
    return (doc for p in files for doc in iter_file(p, text_field))


def input_files(input_path):
    """(kind, files read, other files): a document file ("file"), a folder of them ("folder"; other files in
    it are not read), or a datasets.save_to_disk folder ("saved")."""
    if not os.path.exists(input_path):
        raise UserError(f"--input {input_path} does not exist")
    if os.path.isfile(input_path):
        if not input_path.endswith(DOCUMENT_FILES):
            raise UserError(f"--input {input_path}: unsupported file type; --input takes "
                            f"{', '.join(DOCUMENT_FILES)} files, a folder of them, or a "
                            "datasets.save_to_disk folder")
        return "file", [input_path], []
    everything = sorted(p for p in glob.glob(os.path.join(input_path, "**", "*"), recursive=True)
                        if os.path.isfile(p))
    if any(os.path.exists(os.path.join(input_path, f)) for f in ("dataset_info.json", "dataset_dict.json")):
        return "saved", everything, []
    files = [p for p in everything if p.endswith(DOCUMENT_FILES)]
    if not files:
        raise UserError(f"--input {input_path} holds no {', '.join(DOCUMENT_FILES)} files and is not a "
                        f"datasets.save_to_disk folder")
    return "folder", files, [p for p in everything if not p.endswith(DOCUMENT_FILES)]


def check_utf8(files, chunk=1 << 24):
    """Every .txt and .jsonl file of the input is UTF-8 text, checked in one pass before anything is written
    (decoding runs at GB/s: seconds to a minute for 10B tokens of text): a file that is not is one line
    naming it and the byte, instead of a stop after the shards before it were written, which a rerun of the
    fixed file could not continue (its size and time changed)."""
    import codecs
    for path in files:
        if not path.endswith((".txt", ".jsonl")):  # parquet holds typed strings
            continue
        decoder, done = codecs.getincrementaldecoder("utf-8")(), 0
        with open(path, "rb") as f:
            while True:
                data = f.read(chunk)
                pending = len(decoder.getstate()[0])  # bytes of a character cut by the last chunk's end
                try:
                    decoder.decode(data, final=not data)
                except UnicodeDecodeError as e:
                    at = done - pending + e.start
                    raise UserError(f"{path} is not UTF-8 text ({e.reason} at byte {at:,}): convert it, or "
                                    "move it elsewhere; nothing was written") from None
                if not data:
                    break
                done += len(data)


def contents_fingerprint(input_path, files):
    """A fingerprint of the input files' names, sizes and modification times: a file added, removed or
    changed since the shards were written is noticed without reading it (never 0: that is FineWeb's)."""
    listing = [(os.path.relpath(p, input_path), st.st_size, st.st_mtime_ns)
               for p, st in zip(files, map(os.stat, files))]
    return zlib.crc32(json.dumps(listing).encode()) & 0x7FFFFFFF or 1


def iter_saved_dataset(path, text_field):
    from datasets import DatasetDict, load_from_disk
    ds = load_from_disk(path)
    if isinstance(ds, DatasetDict):
        if "train" not in ds:
            raise UserError(f"{path} is a DatasetDict without a 'train' split (splits: {', '.join(ds)})")
        ds = ds["train"]
    if text_field not in ds.column_names:
        raise UserError(f"{path} has no column {text_field!r} (columns: {', '.join(ds.column_names)}): "
                        f"pass --text_field")
    for batch in ds.iter(batch_size=1024):
        for value in batch[text_field]:
            yield text_of(value, path)


# ------------------------------------------------------------------------------------------------ tokenizing

def encode_batch(texts):
    """[<|endoftext|>] + tokens of each text, concatenated (uint16), and each document's token count."""
    from gptlib.tokenizer import get_encoding
    enc = get_encoding()  # loaded once per worker process
    eot = np.array([enc.eot_token], dtype=np.uint32)
    arrays = []
    for text in texts:
        arrays += [eot, enc.encode_to_numpy(text, disallowed_special=())]  # = [eot] + encode_ordinary(text)
    lengths = np.array([len(a) for a in arrays[1::2]], dtype=np.int64) + 1
    return to_uint16(np.concatenate(arrays), "tokenizer output"), lengths


def end_with(parent):
    """A worker's initializer: exit once `parent` is gone. A parent killed outright (SIGKILL, the OOM killer)
    cannot stop its pool, and a worker blocked reading the task queue would sleep on forever, adopted by
    PID 1; a daemon thread notices the adoption within half a second."""
    def watch():
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)
    threading.Thread(target=watch, daemon=True).start()


def encode_batches(docs, workers, batch_docs=256):
    """Yield encode_batch() of consecutive batches of documents, in order, computed by `workers` processes.
    Batches rather than single documents, and numpy arrays rather than lists of Python ints, keep the
    inter-process traffic small; at most 2 x workers batches are in flight, so memory stays bounded
    however long the stream (Pool.imap would read ahead without limit)."""
    docs = iter(docs)
    with ProcessPoolExecutor(workers, initializer=end_with, initargs=(os.getpid(),)) as pool:
        inflight = collections.deque()
        while batch := list(itertools.islice(docs, batch_docs)):
            inflight.append(pool.submit(encode_batch, batch))
            if len(inflight) >= 2 * workers:
                yield inflight.popleft().result()
        while inflight:
            yield inflight.popleft().result()


# ------------------------------------------------------------------------------------------------ sharding

def shard_name(out_dir, prefix, index):
    return shard_path(out_dir, prefix, "val" if index == 0 else "train", index)


def complete_shards(out_dir, prefix, fingerprints):
    """Headers of the complete shards 0, 1, ... already in out_dir. Removes leftovers of an interrupted run,
    and a damaged shard (wrong header or size) with every shard after it, to be written again identically."""
    for tmp in glob.glob(os.path.join(out_dir, f"{prefix}_*.bin.tmp")):
        os.remove(tmp)
    headers = []
    while os.path.exists(path := shard_name(out_dir, prefix, len(headers))):
        try:
            header = read_header(path)
        except UserError:
            later = list(itertools.takewhile(os.path.exists, (shard_name(out_dir, prefix, i)
                                                              for i in itertools.count(len(headers)))))
            print(f"fineweb: {path} is damaged (wrong header or size): writing it and the {len(later) - 1} "
                  "shards after it again")
            for p in later:
                os.remove(p)
            break
        if header[6] != fingerprints[0]:
            raise UserError(f"{path} was written by fineweb.py with other arguments (input, --text_field or "
                            f"--shard_size, or an older fineweb.py's layout): use another --out_dir or "
                            "--prefix, or delete the old shards")
        if header[7] != fingerprints[1]:
            raise UserError(f"the input files changed since {path} was written (a file added, removed or "
                            f"modified): delete {os.path.join(out_dir, prefix)}_*.bin to tokenize them "
                            "again, or use another --out_dir")
        headers.append(header)
    return headers


def make_out_dir(out_dir):
    """Create out_dir (or take the existing one) and prove it writable, before any tokenizing."""
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise UserError(f"--out_dir {out_dir} is a file, not a folder: choose another --out_dir")
    probe = os.path.join(out_dir, f".fineweb_write_test_{os.getpid()}")
    try:
        os.makedirs(out_dir, exist_ok=True)
        with open(probe, "wb"):
            pass
        os.remove(probe)
    except OSError as e:
        raise UserError(f"--out_dir {out_dir} cannot be created or written ({e.strerror}): choose another "
                        f"--out_dir") from None


def refuse_mixing(out_dir, prefix):
    """Refuse an out_dir holding shards of another prefix (another source): the loader would mix them in."""
    other = sorted(p for split in ("train", "val") for ext in (".bin", ".npy")
                   for p in glob.glob(os.path.join(out_dir, f"*_{split}_*{ext}"))
                   if not os.path.basename(p).startswith(f"{prefix}_{split}_"))
    if other:
        raise UserError(f"{out_dir} already holds other shards ({os.path.basename(other[0])}, ...), which "
                        f"the loader would mix with these: choose another --out_dir")


def default_prefix(input_path, out_dir):
    """The shards' names without --prefix: edufineweb_* for FineWeb-Edu, corpus_* for --input's own files.
    An out_dir already holding edufineweb_* shards keeps that name (an --input's shards were named so before
    corpus_*): a rerun continues them, and one of other input is refused as before."""
    if input_path is None or glob.glob(os.path.join(out_dir, f"{FINEWEB_PREFIX}_*.bin*")):
        return FINEWEB_PREFIX
    return INPUT_PREFIX


def main(input_path, out_dir, text_field, shard_size, prefix, workers):
    check_range("--shard_size", shard_size, 1)
    check_range("--workers", workers, 1)
    prefix = prefix or default_prefix(input_path, out_dir)
    refuse_mixing(out_dir, prefix)
    source = os.path.abspath(input_path) if input_path else f"{REMOTE}/{REMOTE_CONFIG}"
    listing = input_files(input_path) if input_path else None  # a missing input fails here, before out_dir
    val = min(VAL_TOKENS, shard_size)  # part of the layout a rerun must match, where it differs from a shard
    layout = [source, text_field, shard_size] + ([val] if val < shard_size else [])
    fingerprints = (zlib.crc32(json.dumps(layout).encode()) & 0x7FFFFFFF,
                    contents_fingerprint(input_path, listing[1]) if listing else 0)  # 0: FineWeb, the Hub
    done = complete_shards(out_dir, prefix, fingerprints) if os.path.isdir(out_dir) else []
    if len(done) > 1 and done[-1][2] < shard_size:  # a short train shard is the last one: nothing left to do
        print(f"fineweb: all {len(done)} shards in {out_dir} are complete")
        return
    if listing and listing[0] != "saved":  # a bad byte late in the input found now, not after hours of shards
        check_utf8(listing[1])
    docs = iter_documents(input_path, text_field, listing)  # no network fails here, before out_dir
    first = next(docs, EMPTY)  # and a bad or empty first document too
    if first is EMPTY:
        raise UserError(f"the corpus {input_path or source} is empty: no documents to tokenize")
    docs = itertools.chain([first], docs)
    created = not os.path.exists(out_dir)
    try:
        make_out_dir(out_dir)
        write_shards(docs, done, out_dir, prefix, fingerprints, shard_size, workers)
    finally:  # bad input: no empty out_dir left behind
        if created and os.path.isdir(out_dir) and not os.listdir(out_dir):
            os.rmdir(out_dir)


def write_shards(docs, done, out_dir, prefix, fingerprints, shard_size, workers):
    """Tokenize docs into shards after the complete ones (`done`: their headers)."""
    # resume at the stream position recorded in the last complete shard: skip (not tokenize) what it covers
    next_doc = int(done[-1][4:6].view(np.int64)[0]) if done else 0
    skip_tokens = int(done[-1][3]) if done else 0
    for _ in range(next_doc):
        next(docs, None)
    if done:
        print(f"fineweb: {len(done)} complete shards in {out_dir}, resuming at document {next_doc:,}")

    from tqdm import tqdm
    val = min(VAL_TOKENS, shard_size)
    # until the stream passes one shard nothing is written (a corpus within one shard is cut 90/10): buf then
    # holds the val shard's tokens and the first train shard's beginning
    buf = np.empty(shard_size + val, dtype=np.uint16)
    fill, index, doc, total, t0 = 0, len(done), next_doc, 0, time.time()
    doc_ends = []  # where each document ends in buf while nothing is written (a corpus that fits in a shard)
    # closed however the loop ends: a bad document's line is printed on a line of its own
    # a redirected log gets a line every 30 s, not one per batch
    every = 0.1 if sys.stderr.isatty() else 30
    with tqdm(unit="tok", unit_scale=True, desc="tokenizing", mininterval=every) as bar:
        for tokens, lengths in encode_batches(docs, workers):
            ends = np.cumsum(lengths)  # end of each document within `tokens`
            if index == 0:
                doc_ends.extend((fill + ends).tolist())
            pos = skip_tokens  # first token of this batch not yet written
            skip_tokens = 0
            while pos < len(tokens):
                take = min((len(buf) if index == 0 else shard_size) - fill, len(tokens) - pos)
                buf[fill:fill + take] = tokens[pos:pos + take]
                fill, pos = fill + take, pos + take
                if index == 0 and fill > shard_size:  # past one shard: the val shard, its first `val` tokens
                    i = int(np.searchsorted(doc_ends, val, side="right"))  # the document holding token `val`
                    write_shard(shard_name(out_dir, prefix, 0), buf[:val], next_doc + i,
                                val - (doc_ends[i - 1] if i else 0), fingerprints)
                    buf[:fill - val] = buf[val:fill]
                    fill, index = fill - val, 1
                if index > 0 and fill == shard_size:
                    i = int(np.searchsorted(ends, pos, side="right"))  # the document holding the next token
                    offset = pos - (int(ends[i - 1]) if i else 0)
                    write_shard(shard_name(out_dir, prefix, index), buf[:shard_size], doc + i, offset,
                                fingerprints)
                    index, fill = index + 1, 0
            doc += len(lengths)
            total += len(tokens)
            bar.update(len(tokens))
    if index == 0:  # the whole corpus fits in one shard: cut as a data_root file is (not 0 train shards)
        if fill < 2:
            raise UserError(f"the corpus is {fill} token: too small to split into validation and training")
        cut = split_point(fill)
        i = int(np.searchsorted(doc_ends, cut, side="right"))  # the document holding token `cut`
        offset = cut - (doc_ends[i - 1] if i else 0)
        # train first: until the val shard (shard 0) exists, a rerun starts over
        write_shard(shard_name(out_dir, prefix, 1), buf[:cut], next_doc + i, offset, fingerprints)
        write_shard(shard_name(out_dir, prefix, 0), buf[cut:fill], doc, 0, fingerprints)
        fill, index = 0, 2
    if fill:  # the last, short shard
        write_shard(shard_name(out_dir, prefix, index), buf[:fill], doc, 0, fingerprints)
        index += 1
    dt = time.time() - t0
    print(f"fineweb: {total:,} tokens in {dt:.1f}s, {total / dt:,.0f} tokens/s; {index} shards "
          f"({prefix}_val_000000.bin + {index - 1} train) in {out_dir}")
    if not done and total > shard_size and val > total // 10:  # a corpus just past one small shard
        print(f"NOTE: the validation split holds {val:,} of the corpus's {total:,} tokens "
              f"({val / total:.0%}): "
              f"past one shard it is the stream's first min(2^24, --shard_size) tokens; a --shard_size of at "
              f"least {total:,} cuts it 90/10 instead")


# ------------------------------------------------------------------------------------------------ download

def download(out_dir, shards=PRETOKENIZED_TRAIN, repo=PRETOKENIZED, prefix=PRETOKENIZED_PREFIX):
    """The validation shard and the first `shards` train shards (0: none) of the dataset repo, whose shards
    are named {prefix}_val_000000.bin, {prefix}_train_000001.bin, ..., into out_dir. Each comes
    through the Hugging Face cache (HF_HOME / HF_HUB_CACHE and HF_HUB_OFFLINE apply; an interrupted download
    resumes there), is checked (header and size) and only then linked into out_dir under its name (copied if
    the cache is on another file system): a partial or damaged file never stands there. Complete shards in
    out_dir are skipped without asking the Hub."""
    if repo == PRETOKENIZED and not 1 <= shards <= PRETOKENIZED_TRAIN:
        raise UserError(f"--shards={shards}: {PRETOKENIZED} has train shards 1 to {PRETOKENIZED_TRAIN}")
    refuse_mixing(out_dir, prefix)
    names = [os.path.basename(shard_name(out_dir, prefix, i)) for i in range(shards + 1)]
    todo = [name for name in names if not whole(os.path.join(out_dir, name))]
    print(f"fineweb: {len(names) - len(todo)} of {len(names)} shards of {repo} already in {out_dir}")
    if not todo:
        return
    try:
        from huggingface_hub import hf_hub_download
    except ImportError:
        raise UserError("--pretokenized needs huggingface_hub (it comes with datasets: pip install -r "
                        "requirements.txt)") from None
    from gptlib.runtime import hub_online  # here: runtime imports torch, which fineweb.py needs nowhere else
    online = hub_online()  # offline, only the Hub cache is read: seconds, not half a minute of retries
    new = not os.path.exists(out_dir)
    make_out_dir(out_dir)
    for i, name in enumerate(todo, 1):
        print(f"fineweb: {name} ({i}/{len(todo)})", flush=True)
        try:
            cached = hf_hub_download(repo, name, repo_type="dataset", local_files_only=not online)
        except Exception as e:  # offline, no such file, Hub outage: the same way out
            if new and not os.listdir(out_dir):  # nothing left behind by a run that got nothing
                os.rmdir(out_dir)
            if online and missing_on_hub(e) and name != names[0]:  # the dataset has fewer shards
                have = 0  # the complete train shards from the first on
                while have < shards and whole(os.path.join(out_dir, names[have + 1])):
                    have += 1
                raise UserError(f"{repo} has no {name}: it holds fewer train shards than the "
                                f"{shards} asked for; the {have} complete ones in {out_dir} are kept: train "
                                f"on them, or rerun with --shards={have}") from None
            raise UserError(f"could not download {name} from {repo} ({first_line(e)}); without "
                            f"internet, tokenize local files with --input instead") from None
        if not whole(cached):
            raise UserError(f"the downloaded {name} is not a whole token shard (wrong header or size): "
                            f"delete {os.path.realpath(cached)} (the Hugging Face cache's copy) and rerun")
        place(cached, os.path.join(out_dir, name))
    print(f"fineweb: {len(names)} shards ({names[0]} + {len(names) - 1} train) in {out_dir}")


def missing_on_hub(e):
    """Whether the Hub answered that a file does not exist (not: offline and not cached, an outage)."""
    from huggingface_hub.utils import EntryNotFoundError, LocalEntryNotFoundError  # old and new versions
    return isinstance(e, EntryNotFoundError) and not isinstance(e, LocalEntryNotFoundError)


def whole(path):
    """Whether path is a complete token shard."""
    try:
        read_header(path)
        return True
    except UserError:
        return False


def place(src, dst):
    """src at dst, atomically: a hard link (no second copy), or a copy where src is on another file system."""
    tmp = dst + ".tmp"
    if os.path.exists(tmp):
        os.remove(tmp)
    try:
        os.link(os.path.realpath(src), tmp)
    except OSError:
        shutil.copyfile(src, tmp)
    os.replace(tmp, dst)


def cli():
    parser = command_line(__doc__)
    parser.add_argument("--input", default=None,
                        help="local .jsonl/.parquet/.txt file, a folder of them, or a datasets.save_to_disk "
                        f"folder (default: {REMOTE} {REMOTE_CONFIG} from the Hub)")
    parser.add_argument("--out_dir", default=None, help="where the shards go (default: edu_fineweb10B; "
                        "fineweb10B_val with --speedrun_val)")
    parser.add_argument("--text_field", default="text", help="the column holding each document's text")
    parser.add_argument("--shard_size", type=lambda s: int(float(s)), default=int(1e8),
                        help="tokens per shard. A corpus within one shard is cut 90/10; past one, "
                        "validation is the stream's first min(2^24, shard_size) tokens: at or below 2^24 a "
                        "whole shard, most of a corpus just over one")
    parser.add_argument("--prefix", default=None, help="shard file name prefix (default: edufineweb for "
                        "FineWeb-Edu, corpus for --input's files; edufineweb where out_dir holds such "
                        "shards)")
    parser.add_argument("--workers", type=int, default=os.cpu_count(),
                        help="tokenizer processes (default: this machine's cores, %(default)s)")
    parser.add_argument("--pretokenized", action="store_true",
                        help=f"download {PRETOKENIZED} (already tokenized) instead of tokenizing")
    parser.add_argument("--shards", type=int, default=PRETOKENIZED_TRAIN,
                        help="--pretokenized: how many train shards of 100M tokens (default: all)")
    parser.add_argument("--speedrun_val", action="store_true",
                        help=f"download only {SPEEDRUN}'s validation shard, the speedruns' yardstick")
    args = parser.parse_args()
    if sum(map(bool, (args.pretokenized, args.input, args.speedrun_val))) > 1:
        raise UserError("--pretokenized and --speedrun_val download tokens, --input tokenizes local files: "
                        "choose one")
    if args.speedrun_val:
        download(args.out_dir or "fineweb10B_val", 0, SPEEDRUN, SPEEDRUN_PREFIX)
    elif args.pretokenized:
        download(args.out_dir or "edu_fineweb10B", args.shards)
    else:
        main(args.input, args.out_dir or "edu_fineweb10B", args.text_field, args.shard_size, args.prefix,
             args.workers)


if __name__ == "__main__":
    main_guard(cli)  # expected mistakes (a missing or bad input, an unusable out_dir, no network): one line
