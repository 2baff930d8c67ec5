import glob
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import torch
import pytest

from conftest import DOCS, ROOT, TINY, assert_one_line_error, losses, records
from dataloader import (HEADER_BYTES, DataLoaderLite, load_shard, read_header, shard_path, split_point,
                        split_rows, write_shard)
import fineweb
from gptlib.tokenizer import tokenize_file
from gptlib.errors import UserError
from gptlib.tokenizer import get_encoding


def reference(docs):
    enc = get_encoding()
    return np.array([t for d in docs for t in [enc.eot_token] + enc.encode_ordinary(d)], dtype=np.uint16)


def write_docs(path, docs, field="text"):
    """docs as a .jsonl corpus for fineweb.py, each in field."""
    with open(path, "w", encoding="utf-8") as f:
        for i, d in enumerate(docs):
            f.write(json.dumps({"id": i, field: d}) + "\n")


def shards_of(out_dir):
    return sorted(glob.glob(os.path.join(out_dir, "*.bin")), key=lambda p: p[-10:])  # by index


def one_shard_stream(out_dir):
    """The tokens of a corpus within one shard in stream order: the train shard (first 90%), then val."""
    val, train = (load_shard(p) for p in shards_of(out_dir))
    return np.concatenate([train, val])


def make(tmp_path, docs=DOCS, shard_size=97, **kw):
    tmp_path.mkdir(parents=True, exist_ok=True)
    src = tmp_path / "corpus.jsonl"
    write_docs(src, docs)
    out = tmp_path / "shards"
    fineweb.main(str(src), str(out), kw.get("text_field", "text"), shard_size, "t", 2)
    return out


# ------------------------------------------------------------------------------------------------ fineweb.py

@pytest.mark.slow
def test_shards_hold_eot_prefixed_tokens_in_order(tmp_path):
    out = make(tmp_path)
    paths = shards_of(out)
    assert os.path.basename(paths[0]) == "t_val_000000.bin"
    assert [os.path.basename(p) for p in paths[1:3]] == ["t_train_000001.bin", "t_train_000002.bin"]
    sizes = [len(load_shard(p)) for p in paths]
    assert all(s == 97 for s in sizes[:-1]) and 0 < sizes[-1] <= 97
    assert np.array_equal(np.concatenate([load_shard(p) for p in paths]), reference(DOCS))


def test_your_own_files_make_corpus_shards_and_old_edufineweb_ones_continue(tmp_path):
    """Without --prefix, --input's shards are corpus_*, not FineWeb-Edu's edufineweb_*, and the loader reads
    them; an out_dir of edufineweb_* shards that an --input wrote before that name keeps it: the rerun
    continues them (rewriting the ones removed) rather than refusing the folder."""
    src = tmp_path / "corpus.jsonl"
    write_docs(src, DOCS)
    fineweb.main(str(src), str(tmp_path / "mine"), "text", 97, None, 1)
    names = [os.path.basename(p) for p in shards_of(tmp_path / "mine")]
    assert names[:2] == ["corpus_val_000000.bin", "corpus_train_000001.bin"] and len(names) > 3, names
    assert np.array_equal(DataLoaderLite(1, 8, split="train", data_root=str(tmp_path / "mine")).shards[0][1],
                          load_shard(shards_of(tmp_path / "mine")[1]))
    old = tmp_path / "old"
    fineweb.main(str(src), str(old), "text", 97, "edufineweb", 1)  # as fineweb.py named them before
    before = {os.path.basename(p): open(p, "rb").read() for p in shards_of(old)}
    os.remove(shards_of(old)[-1])
    fineweb.main(str(src), str(old), "text", 97, None, 1)
    assert {os.path.basename(p): open(p, "rb").read() for p in shards_of(old)} == before
    assert fineweb.default_prefix(None, str(tmp_path / "mine")) == "edufineweb"  # FineWeb-Edu's own


@pytest.mark.slow
def test_cli_end_to_end(tmp_path):
    src = tmp_path / "corpus.jsonl"
    write_docs(src, DOCS)
    r = subprocess.run([sys.executable, "fineweb.py", "--input", str(src), "--out_dir", str(tmp_path / "o"),
                        "--shard_size", "1e3", "--prefix", "x"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    total = len(reference(DOCS))
    assert f"fineweb: {total:,} tokens in" in r.stdout and "tokens/s" in r.stdout
    assert np.array_equal(np.concatenate([load_shard(p) for p in shards_of(tmp_path / "o")]), reference(DOCS))


@pytest.mark.slow
def test_local_input_kinds(tmp_path, capsys):
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa
    d = tmp_path / "mixed"
    (d / "sub").mkdir(parents=True)
    write_docs(d / "a.jsonl", DOCS[:10])
    pq.write_table(pa.table({"text": DOCS[10:30], "n": list(range(20))}), d / "b.parquet")
    (d / "sub" / "c.txt").write_text("a whole file is one document\n\nwith paragraphs", encoding="utf-8")
    (d / "notes.md").write_text("not read, but counted")
    fineweb.main(str(d), str(tmp_path / "o"), "text", 10_000, "m", 2)
    out = capsys.readouterr().out
    assert "reading the 3 .jsonl, .parquet, .txt files in" in out
    assert "skipping 1 other files (notes.md, ...)" in out
    expected = reference(DOCS[:10] + DOCS[10:30] + ["a whole file is one document\n\nwith paragraphs"])
    assert np.array_equal(one_shard_stream(tmp_path / "o"), expected)
    # a single .txt file (like input.txt) is one document
    fineweb.main(str(d / "sub" / "c.txt"), str(tmp_path / "o2"), "text", 10_000, "m", 1)
    assert np.array_equal(one_shard_stream(tmp_path / "o2"),
                          expected[-len(reference(["a whole file is one document\n\nwith paragraphs"])):])
    # a file added, or one changed, since the shards were written: refused, not taken as complete
    (d / "sub" / "d.txt").write_text("one more document", encoding="utf-8")
    with pytest.raises(UserError, match="the input files changed since .*m_val_000000.bin was written"):
        fineweb.main(str(d), str(tmp_path / "o"), "text", 10_000, "m", 2)
    os.remove(d / "sub" / "d.txt")
    fineweb.main(str(d), str(tmp_path / "o"), "text", 10_000, "m", 2)  # as it was: complete
    assert "all 2 shards" in capsys.readouterr().out
    (d / "sub" / "c.txt").write_text("the same name, other words", encoding="utf-8")
    with pytest.raises(UserError, match="the input files changed"):
        fineweb.main(str(d), str(tmp_path / "o"), "text", 10_000, "m", 2)


@pytest.mark.slow
def test_save_to_disk_dir(tmp_path):
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_dict({"content": DOCS}).save_to_disk(str(tmp_path / "ds"))
    fineweb.main(str(tmp_path / "ds"), str(tmp_path / "o"), "content", 10_000, "s", 2)
    assert np.array_equal(one_shard_stream(tmp_path / "o"), reference(DOCS))
    with pytest.raises(UserError, match="no column 'text'.*content"):
        fineweb.main(str(tmp_path / "ds"), str(tmp_path / "o3"), "text", 10_000, "s", 1)


def test_resume_after_crash_between_write_and_rename(tmp_path, monkeypatch):
    clean = make(tmp_path)
    expected = {os.path.basename(p): open(p, "rb").read() for p in shards_of(clean)}
    src = tmp_path / "corpus.jsonl"
    out = tmp_path / "crash"
    real_replace = os.replace

    def crash_on_shard_3(tmp, final):
        if final.endswith("_000003.bin"):
            raise KeyboardInterrupt("simulated crash")
        real_replace(tmp, final)

    monkeypatch.setattr(os, "replace", crash_on_shard_3)
    with pytest.raises(KeyboardInterrupt):
        fineweb.main(str(src), str(out), "text", 97, "t", 2)
    monkeypatch.setattr(os, "replace", real_replace)
    assert len(shards_of(out)) == 3 and os.path.exists(out / "t_train_000003.bin.tmp")
    loader = DataLoaderLite(1, 4, data_root=str(out))  # the loader sees only whole shards: train 1 and 2
    names = [os.path.basename(name) for name, _ in loader.shards]
    assert names == ["t_train_000001.bin", "t_train_000002.bin"]

    fineweb.main(str(src), str(out), "text", 97, "t", 2)  # rerun: resumes after shard 2
    assert not glob.glob(str(out / "*.tmp"))
    assert {os.path.basename(p): open(p, "rb").read() for p in shards_of(out)} == expected
    fineweb.main(str(src), str(out), "text", 97, "t", 2)  # and a third run has nothing to do
    assert {os.path.basename(p): open(p, "rb").read() for p in shards_of(out)} == expected


def processes():
    """(pid, parent pid, state) of every process, from /proc (Linux)."""
    out = []
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat) as f:
                fields = f.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
        except OSError:  # ended meanwhile
            continue
        out.append((int(stat.split("/")[2]), int(fields[1]), fields[0]))
    return out


def running():
    """The pids of processes that have not ended (an ended one nobody has reaped yet is a zombie, Z)."""
    return {pid for pid, _, state in processes() if state != "Z"}


@pytest.mark.slow
def test_resume_after_sigkill(tmp_path):
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
    rng = np.random.default_rng(0)
    docs = [" ".join(rng.choice(words, size=int(rng.integers(50, 400)))) for _ in range(3000)]
    src = tmp_path / "big.jsonl"
    write_docs(src, docs)
    cmd = [sys.executable, "fineweb.py", "--input", str(src), "--shard_size", "10000", "--workers", "2"]
    subprocess.run(cmd + ["--out_dir", str(tmp_path / "clean")], cwd=ROOT, check=True, capture_output=True)
    expected = {os.path.basename(p): open(p, "rb").read() for p in shards_of(tmp_path / "clean")}
    assert len(expected) > 20

    out = tmp_path / "killed"
    p = subprocess.Popen(cmd + ["--out_dir", str(out)], cwd=ROOT, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True)
    while len(glob.glob(str(out / "*.bin"))) < 3 and p.poll() is None:
        time.sleep(0.01)

    # the parent alone, as the OOM killer would: its tokenizer processes must not outlive it
    children = [pid for pid, ppid, _ in processes() if ppid == p.pid]
    assert children  # --workers 2
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    deadline = time.time() + 10
    while time.time() < deadline and any(pid in running() for pid in children):
        time.sleep(0.1)
    left = [pid for pid in children if pid in running()]
    if left:  # so that a failure leaves nothing running
        os.killpg(p.pid, signal.SIGKILL)
    assert not left, f"tokenizer processes {left} outlived their killed parent"
    written = shards_of(out)
    assert 3 <= len(written) < len(expected)  # killed part way
    for path in written:  # every file under a shard's name is complete and identical to the clean run
        assert open(path, "rb").read() == expected[os.path.basename(path)]
    subprocess.run(cmd + ["--out_dir", str(out)], cwd=ROOT, check=True, capture_output=True)
    assert {os.path.basename(p): open(p, "rb").read() for p in shards_of(out)} == expected

    # damaged shards (the loader refuses them and says to rerun fineweb.py): the rerun writes them again
    paths = shards_of(out)
    with open(paths[5], "r+b") as f:
        f.write(b"garbage!")  # over the magic number
    with open(paths[9], "r+b") as f:
        f.truncate(os.path.getsize(paths[9]) - 100)
    with pytest.raises(UserError, match="rerun the fineweb.py command that made it"):
        load_shard(paths[5])
    r = subprocess.run(cmd + ["--out_dir", str(out)], cwd=ROOT, capture_output=True, text=True)
    said = (f"fineweb: {paths[5]} is damaged (wrong header or size): writing it and the {len(expected) - 6} "
            f"shards after it again")
    assert r.returncode == 0 and said in r.stdout, r.stdout + r.stderr[-2000:]
    assert {os.path.basename(p): open(p, "rb").read() for p in shards_of(out)} == expected


@pytest.mark.slow
def test_cli_mistakes_are_one_line_and_leave_no_out_dir(tmp_path):
    src = tmp_path / "corpus.jsonl"
    write_docs(src, DOCS)
    (tmp_path / "afile").write_text("x")
    (tmp_path / "bad.jsonl").write_text("{not json\n")
    cli = [sys.executable, "fineweb.py", "--workers", "1"]
    offline = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
               "HF_HOME": str(tmp_path / "hf")}
    cases = [  # (arguments, phrases the one line must hold, environment): through the entry point
        (["--input", str(src), "--out_dir", str(tmp_path / "afile")], ["afile is a file, not a folder"],
         None),
        (["--out_dir", str(tmp_path / "o")], ["could not stream HuggingFaceFW/fineweb-edu",
                                              "--input takes local"], offline),
    ]
    for args, phrases, env in cases:
        r = subprocess.run(cli + args, cwd=ROOT, capture_output=True, text=True, env=env)
        assert_one_line_error(r, *phrases)
        assert "tokenizing" not in r.stderr  # refused before any work
        assert not os.path.exists(tmp_path / "o")  # and no empty out_dir left behind
    for src, out, match in [(src, "/proc/no_shards_here", "--out_dir /proc/no_shards_here cannot be "
                                                         "created or written"),
                            (tmp_path / "nope.jsonl", tmp_path / "o", "nope.jsonl does not exist"),
                            (tmp_path / "bad.jsonl", tmp_path / "o", "bad.jsonl:1: not valid JSON")]:
        with pytest.raises(UserError, match=match):
            fineweb.main(str(src), str(out), "text", 97, "edufineweb", 1)
        assert not os.path.exists(tmp_path / "o")


@pytest.mark.slow
def test_a_corpus_smaller_than_a_shard_still_gets_a_train_shard(tmp_path, text):
    """python fineweb.py --input corpus (16k tokens, under the default 100M-token shard): its last 10% becomes
    the val shard and the rest a train shard, so train_gpt2.py trains on it, and validates on the same tokens
    as with the corpus file itself as data_root; a rerun finds both shards complete and changes nothing."""
    src = tmp_path / "corpus.jsonl"
    with open(text, encoding="utf-8") as f:
        docs = f.read().split("\n\n")
    write_docs(src, docs)
    out = tmp_path / "o"
    cli = [sys.executable, "fineweb.py", "--input", str(src), "--out_dir", str(out), "--workers", "1"]
    r = subprocess.run(cli, cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0 and "2 shards (corpus_val_000000.bin + 1 train)" in r.stdout, r.stderr
    val, train_shard = (load_shard(p) for p in shards_of(out))
    assert len(train_shard) == split_point(len(reference(docs)))
    assert np.array_equal(np.concatenate([train_shard, val]), reference(docs))
    for split, tokens in (("train", train_shard), ("val", val)):  # the corpus file as data_root: the same
        assert np.array_equal(DataLoaderLite(1, 8, split=split, data_root=str(src)).shards[0][1], tokens)
    before = {p: open(p, "rb").read() for p in shards_of(out)}
    r = subprocess.run(cli, cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0 and "all 2 shards" in r.stdout, r.stdout + r.stderr
    assert {p: open(p, "rb").read() for p in shards_of(out)} == before
    import train_gpt2
    for root, log in ((out, "log_shards"), (src, "log_file")):  # the shards, or the .jsonl itself
        assert train_gpt2.main(TINY + [f"--data_root={root}", "--max_steps=2",
                                       f"--log_dir={tmp_path / log}"]) == 0
    shards, file = ([(r["step"], r.get("loss"), r.get("val_loss"), r.get("val_bpb"))
                     for r in records(tmp_path / log) if "loss" in r or "val_loss" in r]
                    for log in ("log_shards", "log_file"))
    assert shards == file and file[-1][2] is not None  # the same tokens: the same losses, the same validation


def test_rerun_with_other_arguments_is_refused(tmp_path):
    out = make(tmp_path)
    with pytest.raises(UserError, match="other arguments"):
        fineweb.main(str(tmp_path / "corpus.jsonl"), str(out), "text", 50, "t", 1)


def test_fineweb_errors(tmp_path):
    with pytest.raises(UserError, match="--input .*missing.jsonl does not exist"):
        fineweb.main(str(tmp_path / "missing.jsonl"), str(tmp_path / "o"), "text", 100, "t", 1)
    for empty in ("empty.jsonl", "empty.txt"):  # refused alike: no documents
        (tmp_path / empty).write_text("\n" if empty.endswith(".jsonl") else "")
        with pytest.raises(UserError, match="is empty"):
            fineweb.main(str(tmp_path / empty), str(tmp_path / "o"), "text", 100, "t", 1)
    write_docs(tmp_path / "body.jsonl", ["x"], field="body")
    with pytest.raises(UserError, match=r"body.jsonl:1: no field 'text' \(fields: id, body\)"):
        fineweb.main(str(tmp_path / "body.jsonl"), str(tmp_path / "o"), "text", 100, "t", 1)
    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\n{"text": oops}\n')
    with pytest.raises(UserError, match="bad.jsonl:2: not valid JSON"):
        fineweb.main(str(tmp_path / "bad.jsonl"), str(tmp_path / "o"), "text", 100, "t", 1)
    (tmp_path / "nulls.jsonl").write_text('{"text": null}\n')
    with pytest.raises(UserError, match="NoneType, not str"):
        fineweb.main(str(tmp_path / "nulls.jsonl"), str(tmp_path / "o"), "text", 100, "t", 1)
    (tmp_path / "nothing").mkdir()
    with pytest.raises(UserError, match="holds no .jsonl"):
        fineweb.main(str(tmp_path / "nothing"), str(tmp_path / "o"), "text", 100, "t", 1)
    assert not os.path.exists(tmp_path / "o")  # no empty out_dir left by any of them
    with pytest.raises(UserError, match="token id 70000 does not fit in uint16"):
        write_shard(str(tmp_path / "x.bin"), [1, 70000])
    assert not os.path.exists(tmp_path / "x.bin") and not os.path.exists(tmp_path / "x.bin.tmp")


# ------------------------------------------------------------------------------------------------ shard files

def test_load_shard_is_a_readonly_memmap(tmp_path):
    path = str(tmp_path / "s_train_000001.bin")
    write_shard(path, np.arange(1000))
    tokens = load_shard(path)
    assert isinstance(tokens, np.memmap) and tokens.dtype == np.uint16 and not tokens.flags.writeable
    assert np.array_equal(tokens, np.arange(1000)) and os.path.getsize(path) == HEADER_BYTES + 2000
    assert read_header(path)[:3].tolist() == [20240520, 1, 1000]


def test_bad_shard_files(tmp_path):
    good = str(tmp_path / "good.bin")
    write_shard(good, np.arange(100))
    data = open(good, "rb").read()
    cases = {
        "truncated.bin": (data[:-10], "truncated"),
        "garbage.bin": (b"hello world" * 200, "bad magic"),
        "short.bin": (b"\x00" * 10, "bad magic"),
        "npy.bin": (b"\x93NUMPY" + b"\x00" * 2000, r"build-nanogpt's shard format\) named .bin: name it"),
        "v2.bin": (data[:4] + np.int32(2).tobytes() + data[8:], "version 2"),
        "int32.bin": (data[:HEADER_BYTES] + np.arange(100, dtype=np.int32).tobytes(), "not uint16"),
    }
    for name, (content, match) in cases.items():
        (tmp_path / name).write_bytes(content)
        with pytest.raises(UserError, match=match):
            load_shard(str(tmp_path / name))
    with pytest.raises(UserError, match="does not exist"):
        load_shard(str(tmp_path / "nope.bin"))


# --------------------------------------------------------------------------------------------- DataLoaderLite

SIZES = [3001, 5003, 4100, 2600]  # train shards 1..4 of a toy corpus; shard 0 is val


def toy_shards(tmp_path):
    """Token i of train shard s is (s * 10000 + i): every token says where it came from."""
    d = tmp_path / "toy"
    d.mkdir(exist_ok=True)
    write_shard(shard_path(d, "toy", "val", 0), np.arange(700) + 60000)
    for s, n in enumerate(SIZES, 1):
        write_shard(shard_path(d, "toy", "train", s), s * 10000 + np.arange(n))
    return str(d)


def run_ranks(data_root, B, T, world, steps, **kw):
    loaders = [DataLoaderLite(B, T, r, world, "train", data_root, **kw) for r in range(world)]
    out = []
    for _ in range(steps):
        out.append([l.next_batch() for l in loaders])
        positions = {(l.epoch, l.shard, l.row) for l in loaders}
        assert len(positions) == 1  # every rank moves to the next shard / epoch at the same step
    return loaders, out


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.slow
def test_ranks_cover_each_window_once_per_epoch(tmp_path, world, shuffle):
    B, T = 2, 16
    root = toy_shards(tmp_path)
    loaders, _ = run_ranks(root, B, T, world, 0, shuffle=shuffle, seed=1)
    assert loaders[0].rows_per_shard == [(n - 1) // T for n in SIZES]
    steps = sum(rows // (B * world) for rows in loaders[0].rows_per_shard)
    _, batches = run_ranks(root, B, T, world, 2 * steps, shuffle=shuffle, seed=1)
    epochs = [[], []]
    for i, step in enumerate(batches):
        for x, y in step:
            assert x.dtype == y.dtype == np.int64 or str(x.dtype) == "torch.int64"
            assert x.shape == y.shape == (B, T)
            # next token, same shard
            assert (y[:, :-1] == x[:, 1:]).all() and (y[:, -1] == x[:, -1] + 1).all()
            assert ((x[:, -1] - x[:, 0]) == T - 1).all()  # a window is contiguous in one shard
            epochs[i // steps] += x[:, 0].tolist()
    per_shard = [(n - 1) // T // (B * world) * B * world for n in SIZES]  # the rows that fill whole steps
    for starts in epochs:
        assert len(starts) == len(set(starts))  # no window served twice, across ranks and steps
        for s, (n, used) in enumerate(zip(SIZES, per_shard), 1):
            mine = {x for x in starts if x // 10000 == s}
            assert len(mine) == used and mine <= {s * 10000 + j * T for j in range((n - 1) // T)}
            if not shuffle:  # only the tail of each shard, short of one step, is skipped
                assert mine == {s * 10000 + j * T for j in range(used)}
    assert loaders[0].tokens_per_epoch == sum(per_shard) * T and loaders[0].tokens_total == sum(SIZES)
    if shuffle:
        assert epochs[0] != epochs[1]  # reshuffled each epoch
    else:
        assert epochs[0] == epochs[1]


def npy_shards(tmp_path):
    """toy_shards as build-nanogpt writes them: one np.save'd uint16 array per shard, no header."""
    d = tmp_path / "npy"
    d.mkdir()
    for path in glob.glob(os.path.join(toy_shards(tmp_path), "*.bin")):
        name = os.path.basename(path).replace("toy_", "edufineweb_").replace(".bin", ".npy")
        np.save(d / name, np.asarray(load_shard(path)))
    return str(d)


@pytest.mark.slow
def test_build_nanogpt_npy_shards_load_as_they_are(tmp_path):
    """A folder of build-nanogpt's .npy shards gives the batches, shuffling and exact resume of the same
    tokens as .bin shards: memory-mapped uint16, nothing copied to int64 up front."""
    bins, npys = toy_shards(tmp_path), npy_shards(tmp_path)
    tokens = load_shard(os.path.join(npys, "edufineweb_train_000002.npy"))
    assert isinstance(tokens, np.memmap) and tokens.dtype == np.uint16 and not tokens.flags.writeable
    for shuffle in (False, True):
        _, a = run_ranks(bins, 2, 16, 2, 150, shuffle=shuffle, seed=1)
        loaders, b = run_ranks(npys, 2, 16, 2, 150, shuffle=shuffle, seed=1)
        assert all((x1 == x2).all() and (y1 == y2).all() for s1, s2 in zip(a, b)
                   for (x1, y1), (x2, y2) in zip(s1, s2))
        resumed = DataLoaderLite(2, 16, 1, 2, "train", npys, shuffle=shuffle, seed=1)
        resumed.load_state_dict(json.loads(json.dumps(loaders[1].state_dict())))
        later = run_ranks(npys, 2, 16, 2, 151, shuffle=shuffle, seed=1)[1][-1][1]
        assert all((u == v).all() for u, v in zip(resumed.next_batch(), later))
    val = DataLoaderLite(1, 8, split="val", data_root=npys)
    assert val.tokens_total == 700 and val.next_batch()[0][0, 0] == 60000


def test_npy_shards_of_another_kind_are_one_line(tmp_path):
    npys = npy_shards(tmp_path)
    for array, match in [(np.arange(100, dtype=np.int32), r"holds a int32 array of shape \(100,\)"),
                         (np.zeros((4, 25), dtype=np.uint16), r"holds a uint16 array of shape \(4, 25\)")]:
        bad = os.path.join(npys, "edufineweb_train_000009.npy")
        np.save(bad, array)
        with pytest.raises(UserError, match=match + ".*one uint16 array"):
            DataLoaderLite(1, 8, data_root=npys)
    with open(bad, "wb") as f:
        f.write(b"\x93NUMPY" + b"\x00" * 50)  # truncated
    with pytest.raises(UserError, match="edufineweb_train_000009.npy is not a readable .npy array"):
        DataLoaderLite(1, 8, data_root=npys)
    os.remove(bad)
    write_shard(shard_path(npys, "edufineweb", "train", 9), np.arange(100))
    with pytest.raises(UserError, match="holds both .bin and .npy shards .*one dataset per folder"):
        DataLoaderLite(1, 8, data_root=npys)


@pytest.mark.slow
def test_unshuffled_batches_are_contiguous_slices(tmp_path):
    B, T, world = 3, 8, 2
    root = toy_shards(tmp_path)
    _, batches = run_ranks(root, B, T, world, 5)
    for step, ranks in enumerate(batches):
        for r, (x, y) in enumerate(ranks):
            start = 10000 + step * B * T * world + r * B * T
            assert x.flatten().tolist() == list(range(start, start + B * T))


def test_exact_resume(tmp_path):
    root = toy_shards(tmp_path)
    for shuffle in (False, True):
        for k in (0, 7, 60, 150):  # inside the first shard, later shards, after an epoch wrap
            a = DataLoaderLite(2, 16, 1, 2, "train", root, shuffle=shuffle, seed=3)
            for _ in range(k):
                a.next_batch()
            state = json.loads(json.dumps(a.state_dict()))  # plain types, as in a checkpoint
            b = DataLoaderLite(2, 16, 1, 2, "train", root, shuffle=shuffle, seed=3)
            b.load_state_dict(state)
            for _ in range(200):
                (xa, ya), (xb, yb) = a.next_batch(), b.next_batch()
                assert (xa == xb).all() and (ya == yb).all()
            a.reset()
            c = DataLoaderLite(2, 16, 1, 2, "train", root, shuffle=shuffle, seed=3)
            assert (a.next_batch()[0] == c.next_batch()[0]).all()


@pytest.mark.parametrize("shuffle", [False, True])
def test_resume_with_another_batch_size_or_world_size(tmp_path, shuffle):
    """Saved at B=2 x 2 ranks, resumed at B=3 x 1 rank and B=1 x 2 ranks: the same rows follow, in order."""
    root = toy_shards(tmp_path)

    def stream(loaders, n):  # the window starts served, step by step, rank after rank
        out = []
        while len(out) < n:
            out += [x for l in loaders for x in l.next_batch()[0][:, 0].tolist()]
        return out[:n]

    a = [DataLoaderLite(2, 16, r, 2, "train", root, shuffle=shuffle, seed=5) for r in range(2)]
    stream(a, 7 * 4)  # 7 steps into the first shard
    state = json.loads(json.dumps(a[0].state_dict()))
    assert state == a[1].state_dict() and state["row"] == 28  # one position for every rank
    # the rest of the shard, less a tail that is short of a step somewhere
    n = (len(a[0].rows) - 28) // 12 * 12
    expected = stream(a, n)
    for B, world in ((3, 1), (1, 2)):
        b = [DataLoaderLite(B, 16, r, world, "train", root, shuffle=shuffle, seed=5) for r in range(world)]
        for l in b:
            l.load_state_dict(state)
        assert stream(b, n) == expected and n >= 120


@pytest.mark.slow
def test_document_file_roots(tmp_path):
    """A .txt data_root is one document, a .jsonl one a document per line (its text, not the JSON); a folder
    of documents, or a file of another kind, is refused naming the command that makes shards of it."""
    text = (tmp_path / "play.txt")
    text.write_text(open(os.path.join(ROOT, "input.txt"), encoding="utf-8").read()[:20000], encoding="utf-8")
    write_docs(tmp_path / "docs.jsonl", DOCS[:20])
    assert np.array_equal(tokenize_file(str(tmp_path / "docs.jsonl")), reference(DOCS[:20]))
    (tmp_path / "notes.md").write_text("# notes")
    with pytest.raises(UserError, match=r"notes.md: unsupported file type; documents come in .jsonl, "
                                        r".parquet, .txt files \(name a plain-text file .txt; token shards: give"):
        DataLoaderLite(1, 8, data_root=str(tmp_path / "notes.md"))
    with pytest.raises(UserError, match=f"holds documents .*, not token shards: tokenize them once with "
                                        f"`python fineweb.py --input {tmp_path} --out_dir "
                                        f"{tmp_path}_shards`"):
        DataLoaderLite(1, 8, data_root=str(tmp_path))
    tokens = tokenize_file(str(text))
    assert tokens[0] == 50256 and np.array_equal(tokens[1:], get_encoding().encode_ordinary(text.read_text()))
    cut = int(0.9 * len(tokens))
    train = DataLoaderLite(2, 8, data_root=str(text), split="train")
    val = DataLoaderLite(2, 8, data_root=str(text), split="val")
    assert (train.tokens_total, val.tokens_total) == (cut, len(tokens) - cut)
    x, y = val.next_batch()
    assert x.flatten().tolist() == tokens[cut:cut + 16].tolist()


def test_empty_and_short_validation_shards_hold_no_row(tmp_path):
    """A validation shard with no tokens, or fewer than a row's, holds no row (not -1): the rows after it are
    read where they are, and split_rows (settings.fit's count: 0 is refused) agrees with the loader."""
    tokens = np.arange(100, dtype=np.uint16)
    for i, part in enumerate((tokens[:0], tokens[:5], tokens)):
        write_shard(shard_path(tmp_path, "x", "val", i), part)
    write_shard(shard_path(tmp_path, "x", "train", 3), tokens)
    val = DataLoaderLite(1, 8, split="val", data_root=str(tmp_path))
    assert val.rows_total == split_rows(str(tmp_path), "val", 8) == 12
    x, y = val.read_rows([0, 11])
    assert x[0].tolist() == list(range(8)) and y[1].tolist() == list(range(89, 97))


def test_loader_errors(tmp_path):
    root = toy_shards(tmp_path)
    with pytest.raises(UserError, match="python fineweb.py --input YOUR_FILES --out_dir .*nowhere"):
        DataLoaderLite(1, 8, data_root=str(tmp_path / "nowhere"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match=r"no val shards \(\*_val_\*.bin\)"):
        DataLoaderLite(1, 8, split="val", data_root=str(tmp_path / "empty"))
    with pytest.raises(UserError,  # every train shard shorter than a step: nothing to train on
                       match=r"fewer than one step needs \(B\*T\*num_processes\+1 = 8\*512\*2\+1"):
        DataLoaderLite(8, 512, 0, 2, data_root=root)
    for kw, match in [(dict(B=0, T=8), "B=0"), (dict(B=1, T=-1), "T=-1"),
                      (dict(B=1, T=8, split="test"), "split"),
                      (dict(B=1, T=8, process_rank=2, num_processes=2), "process_rank=2")]:
        with pytest.raises(ValueError, match=match):
            DataLoaderLite(data_root=root, **kw)
    (tmp_path / "toy" / "toy_train_000009.bin").write_bytes(b"\x93NUMPY" + b"\x00" * 100)
    with pytest.raises(UserError, match="build-nanogpt"):
        DataLoaderLite(1, 8, data_root=root)
    os.remove(tmp_path / "toy" / "toy_train_000009.bin")
    state = DataLoaderLite(2, 8, 0, 2, data_root=root).state_dict()
    with pytest.raises(UserError, match="has T=8 but this loader has T=16"):
        DataLoaderLite(2, 16, 0, 1, data_root=root).load_state_dict(state)


def test_train_gpt2_on_npy_shards_equals_bin_shards(tmp_path, text):
    """train_gpt2.py trains on a folder of build-nanogpt .npy shards exactly as on the same tokens in .bin
    shards: the same losses, step for step."""
    tokens = tokenize_file(text)
    (tmp_path / "bin").mkdir()
    (tmp_path / "npy").mkdir()
    for split, part in (("val", tokens[:3000]), ("train", tokens[3000:])):
        write_shard(shard_path(tmp_path / "bin", "edufineweb", split, int(split == "train")), part)
        np.save(tmp_path / "npy" / f"edufineweb_{split}_{int(split == 'train'):06d}.npy", part)
    import train_gpt2
    for kind in ("bin", "npy"):
        train_gpt2.main(TINY + [f"--data_root={tmp_path / kind}", "--max_steps=3", "--eval_interval=3",
                                f"--log_dir={tmp_path / ('log_' + kind)}"])
    assert losses(tmp_path / "log_npy") == losses(tmp_path / "log_bin")
    assert sorted(losses(tmp_path / "log_npy")) == [1, 2, 3]


# ------------------------------------------------------------------------------------ --pretokenized download

def hub_cache(tmp_path, shards, dataset=fineweb.PRETOKENIZED):
    """A Hugging Face cache holding shards {name: tokens} of a dataset (fineweb.PRETOKENIZED), in the layout
    huggingface_hub reads (refs/main names a snapshot; the files lie in it), so the real hf_hub_download
    resolves them offline."""
    repo = tmp_path / "hub" / ("datasets--" + dataset.replace("/", "--"))
    commit = "0123456789abcdef0123456789abcdef01234567"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    (repo / "snapshots" / commit).mkdir(parents=True)
    for name, tokens in shards.items():
        write_shard(str(repo / "snapshots" / commit / name), tokens)
    return tmp_path / "hub", repo / "snapshots" / commit


def pretokenized(shards, out, env):
    return subprocess.run([sys.executable, "fineweb.py", "--pretokenized", "--shards", str(shards),
                           "--out_dir", str(out)], cwd=ROOT, env=env, capture_output=True, text=True)


@pytest.mark.slow
def test_pretokenized_download_through_the_hub_cache_offline(tmp_path):
    """python fineweb.py --pretokenized --shards 2 with HF_HUB_OFFLINE=1: the real hf_hub_download finds the
    val shard and 2 train shards in the cache and they land in out_dir, verified, where the loader reads
    them; a rerun asks nothing of the Hub; a shard that is not there offline, and a damaged one, are one line
    each and leave no file under the shard's name."""
    names = ["finewebedu_val_000000.bin"] + [f"finewebedu_train_{i:06d}.bin" for i in (1, 2)]
    cache, snapshot = hub_cache(tmp_path, {n: np.arange(2000) + 100 * i for i, n in enumerate(names)})
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache)}
    out = tmp_path / "data"
    r = pretokenized(2, out, env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert sorted(os.listdir(out)) == sorted(names)
    for i, name in enumerate(names):
        assert np.array_equal(load_shard(str(out / name)), np.arange(2000) + 100 * i)
    assert DataLoaderLite(4, 16, data_root=str(out)).tokens_total == 4000
    assert all(os.stat(out / n).st_ino == os.stat(snapshot / n).st_ino for n in names)  # linked, not copied
    unreachable = {**{k: v for k, v in env.items() if "proxy" not in k.lower() and k != "HF_HUB_OFFLINE"},
                   "HF_ENDPOINT": "http://127.0.0.1:9"}  # refused at once: no HF_HUB_OFFLINE, no Hub either
    r = pretokenized(2, tmp_path / "again", unreachable)
    assert r.returncode == 0 and sorted(os.listdir(tmp_path / "again")) == sorted(names), r.stderr[-3000:]
    for name in names:  # a rerun finds them complete: not even the cache is read
        os.remove(snapshot / name)
    r = pretokenized(2, out, env)
    assert r.returncode == 0 and "3 of 3 shards of kjj0/finewebedu10B-gpt2 already in" in r.stdout, r.stderr
    r = pretokenized(3, out, env)
    assert_one_line_error(r, "could not download finewebedu_train_000003.bin from kjj0/finewebedu10B-gpt2 (",
                          "without internet, tokenize local files with --input instead")
    # no HF_HUB_OFFLINE, but the Hub does not answer: the cache alone is read, and a new out_dir that got
    # nothing is not left behind
    assert_one_line_error(pretokenized(2, tmp_path / "new", unreachable), "could not download "
                          "finewebedu_val_000000.bin from", "tokenize local files with --input instead")
    assert not (tmp_path / "new").exists()
    write_shard(str(snapshot / "finewebedu_train_000003.bin"), np.arange(500))
    data = (snapshot / "finewebedu_train_000003.bin").read_bytes()
    (snapshot / "finewebedu_train_000003.bin").write_bytes(data[:-100])  # truncated in the cache
    r = pretokenized(3, out, env)
    assert_one_line_error(r, "the downloaded finewebedu_train_000003.bin is not a whole token shard",
                          "(the Hugging Face cache's copy) and rerun")
    assert sorted(os.listdir(out)) == sorted(names)  # nothing under the damaged shard's name
    write_shard(shard_path(out, "edufineweb", "train", 1), np.arange(100))  # tokenized here: another source
    r = pretokenized(2, out, env)
    assert_one_line_error(r, "already holds other shards (edufineweb_train_000001.bin, ...)")


@pytest.mark.slow
def test_the_speedrun_val_shard_downloads_and_scores_a_checkpoint(tmp_path, text):
    """python fineweb.py --speedrun_val fetches kjj0/fineweb10B-gpt2's fineweb_val_000000.bin alone (here
    from the Hub cache, offline) into fineweb10B_val/, and --eval_only scores a checkpoint on that folder of
    one validation shard (no train split needed): the loss of its first val_tokens tokens."""
    import train_gpt2
    from conftest import TINY, records
    tokens = np.arange(5000) % 50257
    cache, _ = hub_cache(tmp_path, {"fineweb_val_000000.bin": tokens}, fineweb.SPEEDRUN)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache)}
    r = subprocess.run([sys.executable, os.path.join(ROOT, "fineweb.py"), "--speedrun_val"], cwd=tmp_path,
                       env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    assert os.listdir(tmp_path / "fineweb10B_val") == ["fineweb_val_000000.bin"]
    assert np.array_equal(load_shard(str(tmp_path / "fineweb10B_val" / "fineweb_val_000000.bin")), tokens)
    train_gpt2.main(TINY + [f"--data_root={text}", "--max_steps=1", f"--log_dir={tmp_path / 'run'}"])
    ckpt = str(tmp_path / "run" / "model_000001.pt")
    assert train_gpt2.main(TINY + ["--eval_only=True", f"--init_from={ckpt}", "--val_tokens=2048",
                                   f"--data_root={tmp_path / 'fineweb10B_val'}",
                                   f"--log_dir={tmp_path / 'eval'}"]) == 0
    [val] = [r for r in records(tmp_path / "eval") if "val_loss" in r]
    assert 0 < val["val_loss"] < 20 and records(tmp_path / "eval")[0]["config"]["val_tokens"] == 2048


def test_a_folder_of_two_sources_is_refused(tmp_path):
    """Shards of two datasets in one folder (fineweb.py refuses to write them there; a copy can put them
    there) are refused at load, naming both: they would be read as one."""
    for prefix in ("edufineweb", "bench"):
        write_shard(shard_path(tmp_path, prefix, "val", 0), np.arange(700))
        write_shard(shard_path(tmp_path, prefix, "train", 1), np.arange(5000))
    with pytest.raises(UserError, match=r"holds the shards of 2 sources \(bench, edufineweb_\*\): one dataset"):
        DataLoaderLite(2, 8, data_root=str(tmp_path))


def test_pretokenized_count_and_a_hub_with_fewer_shards(tmp_path, monkeypatch, capsys):
    """kjj0/finewebedu10B-gpt2 has 99 train shards (103 is kjj0/fineweb10B-gpt2's), so --shards=100 is refused
    before any download; a Hub that answers "no such file" part-way (the download faked) is one line that
    says how many complete shards were kept, and they stay."""
    from gptlib import runtime
    import huggingface_hub
    from huggingface_hub.utils import EntryNotFoundError, LocalEntryNotFoundError
    assert fineweb.PRETOKENIZED_TRAIN == 99
    with pytest.raises(UserError, match="has train shards 1 to 99"):
        fineweb.download(str(tmp_path / "x"), 100)
    source = tmp_path / "hub"
    source.mkdir()

    class RemoteMissing(EntryNotFoundError):  # the Hub's answer for a file it does not have (a 404)
        def __init__(self, message):
            Exception.__init__(self, message)

    def fake_download(repo, name, repo_type, local_files_only):
        index = int(name[-10:-4])
        if index > 2:
            raise RemoteMissing(f"404 Client Error. Entry Not Found for url: .../{name}")
        write_shard(str(source / name), np.arange(1000) + index)
        return str(source / name)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    monkeypatch.setattr(runtime, "hub_online", lambda: True)
    out = tmp_path / "data"
    with pytest.raises(UserError, match=r"kjj0/finewebedu10B-gpt2 has no finewebedu_train_000003.bin: it holds "
                                        r"fewer train shards than the 5 asked for; the 2 complete ones in .* are "
                                        r"kept: train on them, or rerun with --shards=2"):
        fineweb.download(str(out), 5)
    assert sorted(os.listdir(out)) == ["finewebedu_train_000001.bin", "finewebedu_train_000002.bin",
                                       "finewebedu_val_000000.bin"]
    assert fineweb.missing_on_hub(LocalEntryNotFoundError("not in the cache")) is False  # offline: not this


@pytest.mark.slow
def test_a_jsonl_line_that_is_not_an_object_is_one_line(tmp_path):
    """A bare string or a list on a .jsonl line, in a data_root file or fineweb.py's input: one line naming
    the file and the line, not a TypeError."""
    from gptlib.tokenizer import iter_file
    for bad, kind in (('"just text"', "str"), ('["a", "b"]', "list")):
        path = tmp_path / f"{kind}.jsonl"
        path.write_text('{"text": "fine"}\n' + bad + "\n")
        with pytest.raises(UserError, match=rf"{kind}.jsonl:2: the line is a JSON {kind}, not an object: each "
                                            r"line of a .jsonl file must be an object with a 'text' field"):
            list(iter_file(str(path)))
    r = subprocess.run([sys.executable, "fineweb.py", "--input", str(tmp_path / "str.jsonl"), "--out_dir",
                        str(tmp_path / "out")], cwd=ROOT, capture_output=True, text=True)
    err = r.stderr.strip().replace("\r", "\n").splitlines()  # the progress bar, then the line on its own
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert err[-1].startswith("error: ") and "str.jsonl:2: the line is a JSON str, not an object" in err[-1]


def test_a_train_shard_shorter_than_a_step_is_skipped_with_a_note(tmp_path, capsys):
    """A corpus's last shard is usually short (a normal tail): shorter than one step, it is left out of
    training with a NOTE, not a refusal of the whole run; the loader never serves its tokens."""
    import train_gpt2
    root = toy_shards(tmp_path)  # train shards of 3001, 5003, 4100 and 2600 tokens
    loader = DataLoaderLite(4, 512, 0, 2, data_root=root)  # a step takes 4 * 512 * 2 + 1 = 4097
    assert [os.path.basename(n) for n, _ in loader.skipped] == ["toy_train_000001.bin", "toy_train_000004.bin"]
    assert loader.tokens_total == 5003 + 4100
    for _ in range(6):
        x, _ = loader.next_batch()
        assert int(x.min()) >= 20000 and int(x.max()) < 40000  # shards 2 and 3 hold 20000.. and 30000..
    mine = tmp_path / "mine"  # token ids a model takes; the last train shard shorter than a step of 257
    mine.mkdir()
    for split, index, n in (("val", 0, 700), ("train", 1, 5000), ("train", 2, 200)):
        write_shard(shard_path(mine, "m", split, index), np.arange(n) % 50000)
    assert train_gpt2.main(TINY + [f"--data_root={mine}", "--B=8", "--max_steps=1",
                                   f"--log_dir={tmp_path / 'log'}"]) == 0
    said = capsys.readouterr().out  # a step: 8 x 32 + 1 tokens
    assert "NOTE: m_train_000002.bin (200 tokens) is shorter than a step (257 tokens): not trained on" in said


def test_a_resume_on_another_process_count_passes_over_the_shards_too_short_for_its_step(tmp_path):
    """Which train shards are shorter than a step depends on B x processes; they stay in the shard order and
    the saved state (passed over where the order reaches them), so a resume with another process count keeps
    its position (refused at db9da80: the saved list of shards differed)."""
    root = toy_shards(tmp_path)  # train shards of 3001, 5003, 4100 and 2600 tokens
    two = DataLoaderLite(4, 512, 0, 2, data_root=root)  # a step: 4097 tokens, shards 1 and 4 passed over
    one = DataLoaderLite(4, 512, 0, 1, data_root=root)  # 2049: every shard serves
    for _ in range(2):
        two.next_batch()
    one.load_state_dict(two.state_dict())
    assert (one.epoch, one.shard, one.row) == (two.epoch, two.shard, two.row)
    assert torch.equal(one.next_batch()[0], two.next_batch()[0])  # rank 0's next B rows either way
    one.reset()  # at the start of shard 1, which two processes pass over: they go on at shard 2
    two.load_state_dict(one.state_dict())
    assert os.path.basename(two.shards[two.current][0]) == "toy_train_000002.bin" and two.row == 0
    old = {**one.state_dict(), "shards": ["toy_train_000002.bin", "toy_train_000003.bin"], "shard": 1}
    two.load_state_dict(old)  # as db9da80 saved it (the shards that fit a step only): its shard 1 is shard 3
    assert os.path.basename(two.shards[two.current][0]) == "toy_train_000003.bin"
    assert DataLoaderLite(4, 128, 0, 2, "val", root).rows_total == 5  # fewer rows than a step: read by row


@pytest.mark.slow
def test_a_bad_byte_late_in_the_input_is_found_before_any_shard(tmp_path, monkeypatch):
    """A non-UTF-8 file at the end of the input stopped fineweb.py after the shards before it were written,
    and the fixed file's rerun was refused (the input changed): now it is one line naming the file and the
    byte before anything is written, also where the bad byte sits across a read's boundary."""
    from fineweb import check_utf8
    folder = tmp_path / "in"
    folder.mkdir()
    for name in ("a.txt", "b.txt"):
        (folder / name).write_text("Some text. " * 400, encoding="utf-8")
    (folder / "z.txt").write_bytes("é".encode() * 500 + b"\xff tail")
    r = subprocess.run([sys.executable, "fineweb.py", "--input", str(folder), "--out_dir", str(tmp_path / "out"),
                        "--shard_size", "300"], cwd=ROOT, capture_output=True, text=True)
    assert_one_line_error(r, "z.txt is not UTF-8 text (invalid start byte at byte 1,000): convert it, or move "
                             "it elsewhere; nothing was written")
    assert not (tmp_path / "out").exists()
    with pytest.raises(UserError, match="at byte 1,000"):  # the 2-byte é cut at every read's end
        check_utf8([str(folder / "z.txt")], chunk=7)
    check_utf8([str(folder / "a.txt")], chunk=7)


def test_validation_is_a_small_share_past_one_shard(tmp_path, monkeypatch):
    """Past one shard the validation split is the corpus's first VAL_TOKENS (here 50, with shards of 97), not
    a whole shard: a corpus of 1 to 2 shards no longer goes mostly to validation; a corpus of exactly one
    shard is cut 90/10 (it had no train tokens); the stream is whole and in order either way, and a run
    interrupted after any shard resumes into the same files."""
    monkeypatch.setattr(fineweb, "VAL_TOKENS", 50)
    stream = reference(DOCS)
    out = make(tmp_path / "a", shard_size=97)
    sizes = [len(load_shard(p)) for p in shards_of(out)]
    assert sizes[0] == 50 and all(s == 97 for s in sizes[1:-1]) and 0 < sizes[-1] <= 97, sizes
    assert np.array_equal(np.concatenate([load_shard(p) for p in shards_of(out)]), stream)
    assert DataLoaderLite(2, 8, data_root=str(out)).tokens_total == len(stream) - 50
    expected = {os.path.basename(p): open(p, "rb").read() for p in shards_of(out)}

    real, written = fineweb.write_shard, []

    def dies_after(n):  # the process killed after its n-th shard
        def write(*args, **kw):
            if len(written) == n:
                raise KeyboardInterrupt
            real(*args, **kw)
            written.append(args[0])
        return write
    src = tmp_path / "a" / "corpus.jsonl"  # the same file, untouched: a rerun may continue its shards
    for n in (1, 2):
        written.clear()
        out = tmp_path / f"killed{n}"
        monkeypatch.setattr(fineweb, "write_shard", dies_after(n))
        with pytest.raises(KeyboardInterrupt):
            fineweb.main(str(src), str(out), "text", 97, "t", 2)
        monkeypatch.setattr(fineweb, "write_shard", real)
        fineweb.main(str(src), str(out), "text", 97, "t", 2)
        assert {os.path.basename(p): open(p, "rb").read() for p in shards_of(out)} == expected, n

    one = make(tmp_path / "one", shard_size=len(stream))  # exactly one shard: 90/10, as a data_root file
    val, train = (load_shard(p) for p in shards_of(one))
    assert len(train) == split_point(len(stream)) and np.array_equal(np.concatenate([train, val]), stream)


def test_a_validation_split_of_most_of_the_corpus_is_said(tmp_path, capsys):
    """A corpus just past one shard of at most 2^24 tokens validates on a whole shard, most of it: a NOTE says
    so and names the --shard_size that cuts it 90/10; --help says it too. One shard plenty past: no NOTE."""
    stream = reference(DOCS)
    make(tmp_path / "over", shard_size=len(stream) - 1)
    out = capsys.readouterr().out
    assert (f"NOTE: the validation split holds {len(stream) - 1:,} of the corpus's {len(stream):,} tokens "
            f"(100%)") in out and f"a --shard_size of at least {len(stream):,} cuts it 90/10 instead" in out
    make(tmp_path / "many", shard_size=len(stream) // 20)
    assert "NOTE" not in capsys.readouterr().out
    r = subprocess.run([sys.executable, "fineweb.py", "--help"], cwd=ROOT, capture_output=True, text=True)
    said = " ".join(r.stdout.split())
    assert "most of a corpus just over one (default: 100000000)" in said and "(default: text)" in said
    assert f"tokenizer processes (default: this machine's cores, {os.cpu_count()})" in said
