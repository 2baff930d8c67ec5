import hashlib
import os
import shutil

import pytest
import tiktoken

from gptlib.errors import UserError

from gptlib import tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EDGE_CASES = [
    "",
    "Hello, I'm a language model,",
    "  leading and trailing spaces   \n\n\t tabs\r\n",
    "They'll've DON'T it's 1234567 3.14159 $100,000",
    "naïve café — “quotes” 日本語 🙂 \u200b zero-width",
    "<|endoftext|> as plain text",
]


def test_gpt2_ids():
    enc = tokenizer.get_encoding()
    assert enc.encode("Hello, I'm a language model,") == [15496, 11, 314, 1101, 257, 3303, 2746, 11]
    assert enc.eot_token == 50256 and enc.n_vocab == 50257
    assert enc.encode("<|endoftext|>", allowed_special="all") == [50256]
    assert enc.decode([50256]) == "<|endoftext|>"


def test_round_trip():
    enc = tokenizer.get_encoding()
    with open(os.path.join(ROOT, "input.txt"), encoding="utf-8") as f:
        text = f.read(50_000)
    for s in EDGE_CASES + [text]:
        assert enc.decode(enc.encode_ordinary(s)) == s


@pytest.mark.slow
def test_identical_to_tiktokens_own_r50k_base(tmp_path, monkeypatch):
    """tiktoken's loader, pointed at a cache holding our file, is the independent reference."""
    url = "https://openaipublic.blob.core.windows.net/encodings/r50k_base.tiktoken"
    shutil.copy(tokenizer.RANKS_FILE, tmp_path / hashlib.sha1(url.encode()).hexdigest())
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    ref = tiktoken.get_encoding("r50k_base")
    ours = tokenizer.get_encoding()
    with open(os.path.join(ROOT, "input.txt"), encoding="utf-8") as f:
        text = f.read()
    for s in EDGE_CASES + [text]:
        assert ours.encode_ordinary(s) == ref.encode_ordinary(s)
    assert ours.n_vocab == ref.n_vocab and ours.eot_token == ref.eot_token


def test_missing_file(tmp_path):
    with pytest.raises(UserError, match="gpt2.tiktoken"):
        tokenizer.get_encoding(str(tmp_path / "gpt2.tiktoken"))


def test_altered_file(tmp_path):
    with open(tokenizer.RANKS_FILE, "rb") as f:
        data = bytearray(f.read())
    data[100] ^= 1
    bad = tmp_path / "gpt2.tiktoken"
    bad.write_bytes(bytes(data))
    with pytest.raises(UserError, match="sha256"):
        tokenizer.get_encoding(str(bad))
    bad.write_bytes(bytes(data[: len(data) // 2]))  # truncated
    with pytest.raises(UserError, match="altered or truncated"):
        tokenizer.get_encoding(str(bad))
