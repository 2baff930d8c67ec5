"""Documents: the texts in .txt, .jsonl and .parquet files, read one by one for fineweb.py (which writes them
as token shards) and for a data_root file (dataloader.py tokenizes it in memory, as fineweb.py would), and
JSON Lines for hellaswag.py. A malformed file is one line naming the file, the line and the fix.
"""
import functools
import json

import numpy as np

from gptlib.errors import UserError

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
        raise UserError(f"{path}: unsupported file type; documents come in {', '.join(DOCUMENT_FILES)} files")


@functools.lru_cache(maxsize=4)  # the train and the val loader share one tokenization
def tokenize_file(path):
    """A document file's tokens as fineweb.py writes them: each document <|endoftext|> then its GPT-2 tokens
    (in memory, uint16, read-only)."""
    from gptlib.tokenizer import get_encoding
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
