"""GPT-2's byte-pair encoding, offline, and the documents it encodes.

tiktoken.get_encoding("gpt2") downloads OpenAI's vocab files on first use; a machine without internet (or
behind a proxy) fails there. We ship the same merge ranks as tiktoken's r50k_base file (gpt2.tiktoken,
835 KB, also in the openai-whisper sdist as whisper/assets/gpt2.tiktoken), check its sha256, and build the
Encoding from it. Token ids are identical to tiktoken's "gpt2"; <|endoftext|> is 50256.

Documents: the texts in .txt, .jsonl and .parquet files, read one by one for fineweb.py (which writes them as
token shards) and for a data_root file (dataloader.py tokenizes it in memory, as fineweb.py would), and JSON
Lines for hellaswag.py and core_eval.py. A malformed file is one line naming the file, the line and the fix.
"""
import base64
import functools
import hashlib
import json
import os

import numpy as np

import tiktoken

from gptlib.errors import UserError

RANKS_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpt2.tiktoken")
RANKS_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
# GPT-2's pre-tokenizer split (tiktoken's r50k_pat_str): contractions, letters, digits, punctuation, spaces
PAT_STR = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
EOT = 50256  # <|endoftext|>, the document separator
N_VOCAB = 50257


@functools.lru_cache(maxsize=None)
def get_encoding(ranks_file=RANKS_FILE):
    """The GPT-2 tiktoken Encoding, built from the vendored ranks file. Never touches the network."""
    try:
        with open(ranks_file, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise UserError(f"GPT-2 vocab file {ranks_file} is missing. Restore it from the repository (git "
                        f"checkout -- gpt2.tiktoken) or copy whisper/assets/gpt2.tiktoken from the "
                        f"openai-whisper sdist there.") from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != RANKS_SHA256:
        raise UserError(f"GPT-2 vocab file {ranks_file} has sha256 {digest}, expected {RANKS_SHA256}: it "
                        f"is altered or truncated. Restore it from the repository (git checkout -- "
                        f"gpt2.tiktoken).")
    ranks = {base64.b64decode(token): int(rank)
             for token, rank in (line.split() for line in data.splitlines())}
    return tiktoken.Encoding(name="gpt2", pat_str=PAT_STR, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": EOT}, explicit_n_vocab=N_VOCAB)


def encode_many(enc, texts, threads=1):
    """[enc.encode_ordinary(text) for text in texts], on up to `threads` threads: tiktoken encodes without
    the GIL. A thread takes a contiguous share of the texts, not a pool task per text as tiktoken's
    encode_ordinary_batch makes (4x slower than one thread on 40k short texts)."""
    texts = list(texts)
    threads = max(1, min(threads, len(texts) // 256))  # a few hundred texts: one thread costs less
    if threads == 1:
        return [enc.encode_ordinary(text) for text in texts]
    from concurrent.futures import ThreadPoolExecutor
    cut = [len(texts) * k // threads for k in range(threads + 1)]
    with ThreadPoolExecutor(threads) as pool:
        shares = pool.map(lambda a, b: [enc.encode_ordinary(t) for t in texts[a:b]], cut[:-1], cut[1:])
        return [tokens for share in shares for tokens in share]


@functools.lru_cache(maxsize=None)  # 50k decodes: once per run, not at every evaluation
def token_bytes(enc, vocab_size):
    """vocab_size ints (a tuple: cached, so shared by every caller): each token's length in UTF-8 bytes of
    text, for bits per byte. Special tokens (<|endoftext|>) and the ids past the vocabulary that padding adds
    count 0: they are no text."""
    special = {enc.encode_single_token(s) for s in enc.special_tokens_set}
    lengths = [0 if t in special else len(enc.decode_single_token_bytes(t)) for t in range(enc.n_vocab)]
    return tuple(lengths) + (0,) * (vocab_size - enc.n_vocab)


# ------------------------------------------------------------------------------------------------ HF files

def byte_chars():
    """GPT-2's printable stand-in for each byte (its encoder.py's bytes_to_unicode), in which vocab.json and
    merges.txt spell token bytes: printable Latin-1 bytes stand for themselves, the other bytes (controls,
    space) for the characters from U+0100 on, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    return {**{b: chr(b) for b in printable}, **{b: chr(256 + i) for i, b in enumerate(others)}}


def merge_of(token, ranks):
    """The two tokens whose merge makes `token`: byte-pair encoding of its bytes with only the merges ranked
    before it, which stops at two parts."""
    parts, rank = [bytes([b]) for b in token], ranks[token]
    while len(parts) > 2:
        pairs = [(ranks.get(a + b, rank), i) for i, (a, b) in enumerate(zip(parts, parts[1:]))]
        _, i = min(pairs)
        parts[i:i + 2] = [parts[i] + parts[i + 1]]
    return parts


@functools.lru_cache(maxsize=None)  # ~2 s: once per process
def vocab_and_merges():
    """GPT-2's vocab.json and merges.txt for transformers, made from the vendored ranks."""
    import json
    ranks, chars = get_encoding()._mergeable_ranks, byte_chars()
    spell = lambda token: "".join(chars[b] for b in token)  # noqa: E731
    vocab = {**{spell(token): rank for token, rank in ranks.items()}, "<|endoftext|>": EOT}
    merges = [" ".join(map(spell, merge_of(token, ranks))) for token in sorted(ranks, key=ranks.get)
              if len(token) > 1]
    return json.dumps(vocab, ensure_ascii=False), "#version: 0.2\n" + "\n".join(merges) + "\n"


def hf_tokenizer_files(max_length):
    """{file name: text}: GPT-2's tokenizer for transformers, so that AutoTokenizer on the folder, offline,
    encodes text as get_encoding().encode_ordinary does. max_length: the model's positions."""
    import json
    vocab, merges = vocab_and_merges()
    special = {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>"}
    # split_special_tokens: "<|endoftext|>" inside a text is text, as encode_ordinary has it (the separator
    # between documents is the id, added by who joins them)
    config = {"tokenizer_class": "GPT2Tokenizer", "model_max_length": max_length, "add_prefix_space": False,
              "split_special_tokens": True}
    return {"vocab.json": vocab, "merges.txt": merges,
            "special_tokens_map.json": json.dumps(special, indent=2),
            "tokenizer_config.json": json.dumps({**config, **special}, indent=2)}


# ------------------------------------------------------------------------------------------------------------
# documents

DOCUMENT_FILES = (".jsonl", ".parquet", ".txt")  # what fineweb.py --input tokenizes and data_root reads


def iter_jsonl(path):
    """(where, row) for each non-blank line of a .jsonl file; where is "path:line" for error messages."""
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                row = json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError as e:
                raise UserError(f"{path}:{lineno}: not UTF-8 text ({e.reason}): convert the file") from None
            except json.JSONDecodeError as e:
                raise UserError(f"{path}:{lineno}: not valid JSON ({e})") from None
            yield f"{path}:{lineno}", row


def text_of(value, where):
    if not isinstance(value, str):
        raise UserError(f"{where}: a document's text is {type(value).__name__}, not str: check --text_field")
    return value


def field(row, text_field, where):
    if not isinstance(row, dict):
        raise UserError(f"{where}: the line is a JSON {type(row).__name__}, not an object: each line of a "
                        f".jsonl file must be an object with a {text_field!r} field")
    if text_field not in row:
        raise UserError(f"{where}: no field {text_field!r} (fields: {', '.join(row)}): pass --text_field")
    return text_of(row[text_field], where)


def iter_file(path, text_field="text"):
    """The documents' texts of one file: a .txt file is one document (an empty one none), a .jsonl file one
    per line and a .parquet file one per row (their text_field)."""
    if path.endswith(".txt"):
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except UnicodeDecodeError as e:
            raise UserError(f"{path} is not UTF-8 text ({e.reason} at byte {e.start:,}): convert it, or move "
                            "it elsewhere") from None
        if text:
            yield text
    elif path.endswith(".jsonl"):
        for where, row in iter_jsonl(path):
            yield field(row, text_field, where)
    elif path.endswith(".parquet"):
        import pyarrow.parquet as pq  # comes with datasets
        pf = pq.ParquetFile(path)
        if text_field not in pf.schema_arrow.names:
            raise UserError(f"{path} has no column {text_field!r} (columns: "
                            f"{', '.join(pf.schema_arrow.names)}): pass --text_field")
        for batch in pf.iter_batches(columns=[text_field], batch_size=1024):
            for value in batch.column(0).to_pylist():
                yield text_of(value, path)
    else:
        raise UserError(f"{path}: unsupported file type; documents come in {', '.join(DOCUMENT_FILES)} files "
                        "(name a plain-text file .txt; token shards: give their folder)")


@functools.lru_cache(maxsize=4)  # the train and the val loader share one tokenization
def tokenize_file(path):
    """A document file's tokens as fineweb.py writes them: each document <|endoftext|> then its GPT-2 tokens
    (in memory, uint16, read-only)."""
    enc = get_encoding()
    tokens, texts = [], 0
    for text in iter_file(path):
        tokens.append(enc.eot_token)
        tokens.extend(enc.encode_ordinary(text))
        texts += bool(text)
    if not texts:  # an empty file: no split would hold a row
        raise UserError(f"data_root {path} holds no text: give a file with text in it (input.txt, say)")
    tokens = np.array(tokens, dtype=np.uint16)
    tokens.flags.writeable = False
    return tokens
