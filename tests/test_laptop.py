"""dev/laptop_vs_nanogpt.py, the laptop run against nanoGPT's: the held-out bytes against a plain computation
of both projects' cuts, our model's bits per byte against one window at a time, a wrong --peer's one line,
and the whole tool once from another folder, and stopped once, against a stand-in for nanoGPT's folder
(tests/workers/nanogpt_standin/: its model a bigram table, whose held-out bits per byte have a closed
form)."""
import glob
import importlib.util
import math
import os
import pickle
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conftest import ENV, ROOT, assert_one_line_error, build, tiny
from gptlib.errors import UserError
from gptlib.tokenizer import get_encoding

TOOL = os.path.join(ROOT, "dev", "laptop_vs_nanogpt.py")
STANDIN = os.path.join(ROOT, "tests", "workers", "nanogpt_standin")


@pytest.fixture(scope="module")
def tool():
    spec = importlib.util.spec_from_file_location("laptop_vs_nanogpt", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def plain_cuts(text):
    """(our validation's first byte, nanoGPT's first character) computed plainly: our tokens are
    <|endoftext|> and the text's, cut at 90%; nanoGPT cuts the characters at 90%."""
    enc = get_encoding()
    tokens = [enc.eot_token] + enc.encode_ordinary(text)
    return len(enc.decode_bytes(tokens[1:int(0.9 * len(tokens))])), int(0.9 * len(text))


def test_held_out_bytes_follow_the_later_cut(tool, tmp_path):
    """held_out: the bytes after both validation cuts, ours (read from the loader) or nanoGPT's (its val.bin)
    whichever is later, each case met; a text that is not ASCII, or has carriage returns, is one line."""
    texts = {"theirs later": "a1b2c3d4, " * 900 + "the " * 1000, "ours later": "the " * 3000 + "x7q, " * 300}
    for case, text in texts.items():
        ours, theirs = plain_cuts(text)
        assert (theirs > ours) == (case == "theirs later"), (case, ours, theirs)
        folder = tmp_path / case
        data = folder / "data" / "shakespeare_char"
        data.mkdir(parents=True)
        (folder / "input.txt").write_text(text)
        chars = sorted(set(text))  # nanoGPT's split, as its prepare.py writes it
        np.array([chars.index(c) for c in text[theirs:]], dtype=np.uint16).tofile(data / "val.bin")
        with open(data / "meta.pkl", "wb") as f:
            pickle.dump({"itos": dict(enumerate(chars))}, f)
        start = max(ours, theirs)
        assert tool.held_out(str(folder / "input.txt"), str(folder)) == (start, text[start:].encode())
    for bad in ("naïve " * 100, "line\r\n" * 100):
        (tmp_path / "bad.txt").write_text(bad, newline="")
        with pytest.raises(UserError, match="bad.txt: not ASCII text with \\\\n line ends"):
            tool.held_out(str(tmp_path / "bad.txt"), str(tmp_path / "theirs later"))


def test_a_run_on_another_text_is_one_line(tool, tmp_path):
    """check_trained_on: our run's data_root (relative: from the project's root) must be the text whose
    held-out bytes are scored."""
    text = os.path.join(ROOT, "input.txt")
    tool.check_trained_on({"config": {"data_root": "input.txt"}}, text, "")
    tool.check_trained_on({"config": {"data_root": text}}, text, "")
    for data_root in ("edu_fineweb10B", str(tmp_path / "other.txt")):
        with pytest.raises(UserError, match=f"^train_gpt2.py --n_layer=8 trained on .*{data_root}, not "
                                            f"{text}: pass --data_root={text} in --ours"):
            tool.check_trained_on({"config": {"data_root": data_root}}, text, "--n_layer=8")


def test_our_bits_per_byte_window_by_window(tool, tmp_path, monkeypatch):
    """score_ours: the summed NLL of each token after the first, in non-overlapping windows of T (a shorter
    last one), several windows a forward, over the bytes of those tokens: against a plain loop of one window
    at a time."""
    model = build(tiny(vocab_size=50304, block_size=16))
    with open(os.path.join(ROOT, "input.txt"), "rb") as f:
        text = f.read()[:700]
    enc = get_encoding()
    ids = enc.encode_ordinary(text.decode())
    assert (len(ids) - 1) % 8 and (len(ids) - 1) // 8 > 3  # a shorter last window; more than a forward's
    monkeypatch.setattr(tool, "UNITS", 24)  # 3 windows a forward
    nats = 0.0
    with torch.no_grad():
        for i in range(0, len(ids) - 1, 8):
            x, y = torch.tensor(ids[i:i + 9][:-1]), torch.tensor(ids[i + 1:i + 9])
            nats += F.cross_entropy(model(x[None])[0][0], y, reduction="sum").item()
    predicted = len(text) - len(enc.decode_bytes(ids[:1]))  # bytes
    assert tool.score_ours(model, 8, text) == pytest.approx(nats / math.log(2) / predicted, rel=1e-5)


def test_a_wrong_peer_is_one_line(tool, tmp_path, monkeypatch):
    """--peer names no folder, or a folder without one of nanoGPT's files: one line naming the path, what is
    wrong (the missing file) and the fix."""
    (tmp_path / "train.py").write_text("")
    for peer, wrong in ((tmp_path / "nope", "no such folder"), (tmp_path, "not nanoGPT's folder \\(no model.py in "
                                                                          "it\\)")):
        monkeypatch.setattr(sys, "argv", ["laptop_vs_nanogpt.py", "--peer", str(peer)])
        with pytest.raises(UserError, match=f"^--peer {peer}: {wrong}: give a clone of github.com/karpathy/"
                                            "nanoGPT"):
            tool.main()


@pytest.mark.slow
def test_the_tool_from_another_folder(tmp_path, text):
    """From another folder, --peer relative to it, on the tests' short text: a candidate and the stand-in
    in a round, each run's line and sample, the table (steps: our checkpoint's, the stand-in's 31 for
    --max_iters=30), the held-out bytes where plain_cuts puts them, and the stand-in's held-out bpb the
    closed form of its bigram table; a wrong --peer through the real entry point: one line, exit 1."""
    peer = os.path.relpath(STANDIN, tmp_path)
    ours = f"--data_root={text} --max_steps=2"
    cmd = [sys.executable, TOOL, "--peer", peer, "--text", text, "--pairs", "1", f"--ours={ours}",
           "--peer_flags=--max_iters=30 --eval_interval=10", "--keep", "runs"]
    r = subprocess.run(cmd, cwd=tmp_path, env=ENV, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    with open(text) as f:
        text = f.read()
    start = max(plain_cuts(text))
    assert f"from byte {start:,} to its end, {len(text) - start:,} bytes" in r.stdout
    rows = re.findall(r"^\| (.+?) \| (\d+) \| (\d+) \| (\d+) \| (\d\.\d{4}) \|$", r.stdout, re.M)
    assert [(name, steps) for name, _, _, steps, _ in rows] == [
        (f"`python train_gpt2.py {ours}`", "2"), ("nanoGPT's recipe --max_iters=30 --eval_interval=10", "31")]
    assert len(re.findall(r"^round 1, .+ bpb; sample:\n\s*\S", r.stdout, re.M)) == 2
    ckpt = torch.load(tmp_path / "runs" / "nanogpt" / "out0_1" / "ckpt.pt", weights_only=True)
    with open(tmp_path / "runs" / "nanogpt" / "data" / "shakespeare_char" / "meta.pkl", "rb") as f:
        stoi = pickle.load(f)["stoi"]
    ids = torch.tensor([stoi[c] for c in text[start:]])
    logp = torch.log_softmax(ckpt["model"]["table.weight"], dim=1)
    bpb = -logp[ids[:-1], ids[1:]].sum().item() / math.log(2) / (len(ids) - 1)
    assert float(rows[1][4]) == pytest.approx(bpb, abs=6e-5)
    assert all(2 < float(row[4]) < 17 for row in rows), rows  # a bigram at 30 steps, ours at 2 or 3
    assert_one_line_error(subprocess.run([sys.executable, TOOL, "--peer", "no/such"], cwd=tmp_path,
                                         capture_output=True, text=True), "--peer no/such: no such folder")


@pytest.mark.slow
def test_a_stop_ends_the_run_and_removes_the_work_folder(tmp_path, text):
    """SIGTERM while the stand-in's training runs (endless here): the tool had named the run and its output
    file when it started, and the stop ends that run and removes the temporary work folder (before: nothing
    said for the whole run, and the child trained on in a folder left behind)."""
    tmp = tmp_path / "tmp"  # the tool's temporary folders, through TMPDIR
    tmp.mkdir()
    cmd = [sys.executable, TOOL, "--peer", STANDIN, "--text", text, "--only", "peer", "--pairs", "1",
           "--peer_flags=--max_iters=100000000 --eval_interval=100000000"]
    p = subprocess.Popen(cmd, env={**ENV, "TMPDIR": str(tmp)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    children = []
    try:
        deadline = time.time() + 120
        while not any("iter 3:" in open(f).read() for f in glob.glob(f"{tmp}/*/peer0_0.out")):
            assert p.poll() is None and time.time() < deadline, p.communicate()
            time.sleep(0.2)
        for pid in filter(str.isdigit, os.listdir("/proc")):  # the training: it runs in the work folder
            try:
                if os.readlink(f"/proc/{pid}/cwd").startswith(str(tmp)):
                    children.append(int(pid))
            except OSError:
                pass
        assert children
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=60)
        assert p.returncode == 128 + signal.SIGTERM and not err, (p.returncode, err[-2000:])
        assert re.search(r"^running train.py, its output in .*/peer0_0.out$", out, re.M), out
        assert os.listdir(tmp) == []
        for pid in children:
            assert not os.path.exists(f"/proc/{pid}"), f"{pid} outlived the stop"
    finally:  # whatever this test left running
        p.kill()
        for pid in children:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
