"""Evaluation through train_gpt2.py: val bits per byte against a plain computation, --eval_only=True runs
(an HF folder, a checkpoint; torchrun), and the run metadata in a log's first record."""
import glob
import math
import os
import platform
import subprocess

import pytest
import torch
from torch.nn import functional as F

from conftest import DOCS, ROOT, hellaswag_example, records, save_model, train, write_jsonl
from dataloader import load_shard
import fineweb
from gptlib import hf_gpt2
from gptlib.checkpoint import checkpoints
from gptlib.errors import UserError
from gptlib.tokenizer import EOT, get_encoding
from model import GPT, GPTConfig

B, T, VAL_ROWS = 2, 16, 11  # 11 rows: neither B nor 2 ranks divide them (batches padded, shares unequal)
EVAL = ["--device=cpu", f"--B={B}", f"--T={T}", f"--total_batch_size={B * T * 2}",
        f"--val_tokens={VAL_ROWS * T}", "--compile=False"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """Shards of documents with <|endoftext|> between them and multi-byte characters; a tiny random GPT-2
    saved as an HF folder and as a checkpoint; 5 HellaSwag examples."""
    d = tmp_path_factory.mktemp("eval")
    write_jsonl(d / "corpus.jsonl", [{"text": doc} for doc in DOCS * 2])
    fineweb.main(str(d / "corpus.jsonl"), str(d / "shards"), "text", 400, "t", 2)
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=64, vocab_size=50257, n_layer=2, n_head=2, n_embd=32)).eval()
    hf_gpt2.save_pretrained(model, d / "hf")
    save_model(model, d / "model_000007.pt", step=7)
    data = write_jsonl(d / "hs.jsonl", [hellaswag_example(i) for i in range(5)])
    return d, model, data


def val_tokens(data_root):
    """The first VAL_ROWS rows of T+1 tokens of the val shard (they overlap by one), read from the file."""
    return load_shard(glob.glob(str(data_root / "*val*.bin"))[0])[:VAL_ROWS * T + 1]


def plain_val(model, data_root):
    """(val loss, val bpb) one token at a time: the validation split's first VAL_ROWS rows, each row through
    the model alone, each target's loss from its own log-softmax; bytes from decoding each target token
    (<|endoftext|>: none)."""
    enc = get_encoding()
    nats = text_nats = tokens = text_bytes = 0.0
    row_tokens = torch.tensor(val_tokens(data_root).astype("int64"))
    for j in range(VAL_ROWS):
        row_x, row_y = row_tokens[j * T: j * T + T], row_tokens[j * T + 1: j * T + T + 1]
        with torch.no_grad():
            logits, _ = model(row_x[None])
        for logit, target in zip(logits[0], row_y.tolist()):
            loss = -F.log_softmax(logit.double(), -1)[target].item()
            n = 0 if target == EOT else len(enc.decode_single_token_bytes(target))
            nats, tokens = nats + loss, tokens + 1
            if n:
                text_nats, text_bytes = text_nats + loss, text_bytes + n
    return nats / tokens, text_nats / (math.log(2) * text_bytes)


@pytest.mark.slow
def test_eval_only_under_torchrun_bpb_and_run_record(tmp_path, setup):
    """--eval_only=True with an HF folder on 2 gloo ranks: val loss and bpb (summed over both ranks' shares)
    equal a plain token-by-token computation over the same rows as one process reads (the next test);
    HellaSwag and samples run; nothing is trained or saved. The
    first record says what ran the run."""
    d, model, data = setup
    log = tmp_path / "log"
    r = train(EVAL + ["--eval_only=True", f"--init_from={d / 'hf'}", f"--data_root={d / 'shards'}",
                      "--hellaswag=5",
                    f"--hellaswag_data={data}", f"--log_dir={log}"], cwd=tmp_path, nproc=2)
    recs = records(log)
    assert recs[0]["event"] == "start" and not any("loss" in rec for rec in recs) and not checkpoints(log)
    (val,) = [rec for rec in recs if "val_loss" in rec]
    (hs,) = [rec for rec in recs if "hellaswag" in rec]
    assert val["step"] == hs["step"] == 0 and hs["hellaswag_n"] == 5 and any("samples" in rec for rec in recs)
    assert f"hf: val loss {val['val_loss']:.4f} | val bpb {val['val_bpb']:.4f}" in r.stdout  # no "step 0"
    assert "hf: hellaswag acc_norm" in r.stdout and "step 0" not in r.stdout
    assert "5 HellaSwag examples" in r.stdout and "accumulation steps" not in r.stdout  # no training report
    # those used
    tokens = val_tokens(d / "shards")
    assert (tokens == EOT).sum() >= 3 and any(len(get_encoding().decode_single_token_bytes(t)) > 1 and
                                              not get_encoding().decode_single_token_bytes(t).isascii()
                                              for t in tokens)  # both cases occur
    loss, bpb = plain_val(model, d / "shards")
    assert math.isclose(val["val_loss"], loss, rel_tol=1e-5), (val["val_loss"], loss)
    assert math.isclose(val["val_bpb"], bpb, rel_tol=1e-5), (val["val_bpb"], bpb)
    info = recs[0]["run"]
    assert info["torch"] == torch.__version__ and info["python"] == platform.python_version()
    assert sum(info["devices"].values()) == 2 and info["hosts"] == 1 and info["backend"] == "gloo"
    assert info["dtype"] == "fp32" and info["compile"] is False and info["fused_adamw"] is False
    git = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    if git.returncode == 0:  # a git checkout (CI clones one)
        assert info["git_commit"] == git.stdout.strip() and isinstance(info["git_dirty"], bool)
    assert recs[0]["config"]["eval_only"] is True and recs[0]["config"]["B"] == B  # the effective settings


def test_eval_only_from_a_checkpoint_and_mistakes(tmp_path, setup):
    """A checkpoint's weights give the plain computation's values (one process); an earlier evaluation's log
    in the same log_dir is kept as metrics.1.jsonl, the new one starts afresh. Without weights, or into a training run's log_dir: one line, no
    log_dir."""
    import train_gpt2
    d, model, _ = setup
    args = EVAL + [f"--data_root={d / 'shards'}", "--hellaswag=0", "--total_batch_size=32"]
    log = tmp_path / "ckpt"
    log.mkdir()
    (log / "metrics.jsonl").write_text('{"step": 0, "val_loss": 1.0}\n')  # an earlier evaluation's
    assert train_gpt2.main(args + ["--eval_only=True", f"--init_from={d / 'model_000007.pt'}",
                                   f"--log_dir={log}"]) == 0
    recs = records(log)
    (val,) = [rec for rec in recs if "val_loss" in rec]
    assert (log / "metrics.1.jsonl").read_text() == '{"step": 0, "val_loss": 1.0}\n'  # kept aside
    assert recs[0]["event"] == "start" and recs[0]["config"]["init_from"].endswith("model_000007.pt")
    loss, bpb = plain_val(model, d / "shards")
    assert math.isclose(val["val_loss"], loss, rel_tol=1e-5)
    assert math.isclose(val["val_bpb"], bpb, rel_tol=1e-5)
    # another micro-batch reads the same rows (11 = 2 x 5 + 1 padded; now 1 x 11): the same values
    assert train_gpt2.main(args + ["--eval_only=True", f"--init_from={d / 'model_000007.pt'}", "--B=1",
                                   f"--log_dir={log}"]) == 0
    (val1,) = [rec for rec in records(log) if "val_loss" in rec]
    assert math.isclose(val1["val_loss"], loss, rel_tol=1e-5)
    assert math.isclose(val1["val_bpb"], bpb, rel_tol=1e-5)
    with pytest.raises(UserError, match="--eval_only=True evaluates given weights: set --init_from"):
        train_gpt2.main(args + ["--eval_only=True", f"--log_dir={tmp_path / 'x'}"])
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "model_000002.pt").write_bytes(b"")
    with pytest.raises(UserError, match="holds a training run's checkpoints: .*--log_dir=NEW"):
        train_gpt2.main(args + ["--eval_only=True", f"--init_from={d / 'hf'}",
                                f"--log_dir={tmp_path / 'train'}"])
    assert not os.path.exists(tmp_path / "x")  # refused before any log_dir is made


@pytest.mark.slow
def test_eight_processes_train_evaluate_and_resume_on_two_as_one_process_does(tmp_path, text, reference):
    """The command users run, at --nproc_per_node=8 on gloo (a fine-tune of a tiny model): 2 steps of 8 rows
    (one a rank), a checkpoint, and an evaluation divided over the 8 unevenly (9 validation rows: shares of 2
    and 1 and none; 7 HellaSwag examples: one rank has none; CORE's 5 tasks of 3), then the same run extended
    on 2 processes to step 4 with --max_steps alone, from a folder without edu_fineweb10B/: every setting the
    first command named is kept. Every step's loss and the validation loss are one process's to float
    rounding (each step reads the same rows, each row once), HellaSwag's and CORE's accuracies are equal."""
    from conftest import TINY, write_core_bundle
    data = write_jsonl(tmp_path / "hs.jsonl", [hellaswag_example(i) for i in range(7)])
    bundle = write_core_bundle(tmp_path / "bundle", n=3)
    *_, weights = checkpoints(reference[2])
    args = TINY + [f"--data_root={text}", f"--init_from={weights}", "--total_batch_size=1024", "--val_tokens=288", "--eval_interval=2",
                   "--checkpoint_interval=2", "--hellaswag=7", f"--hellaswag_data={data}", "--core=3",
                   f"--core_bundle={bundle}"]
    import train_gpt2  # the reference: one process, uninterrupted (max_steps=2 then 4 changes no learning
    # rate: steps 1 and 2 are the warm-up's)
    assert train_gpt2.main(args + ["--max_steps=4", f"--log_dir={tmp_path / 'one'}"]) == 0
    log = tmp_path / "log"
    r = train(args + ["--max_steps=2", f"--log_dir={log}"], cwd=tmp_path, nproc=8)
    assert "1,024 tokens = 4 x 32 x 8 processes x 1 accumulation step;" in r.stdout
    r = train(["--max_steps=4", f"--log_dir={log}"], cwd=tmp_path, nproc=2)
    assert "resuming from" in r.stdout and "4 x 32 x 2 processes x 4 accumulation steps" in r.stdout
    first, resumed = (rec["config"] for rec in records(log) if rec.get("event") == "start")
    assert resumed == {**first, "max_steps": 4}
    got, want = records(log), records(tmp_path / "one")
    for key in ("loss", "val_loss", "val_bpb", "hellaswag", "core"):
        ours, theirs = ([(rec["step"], rec[key]) for rec in recs if key in rec and "event" not in rec]
                        for recs in (got, want))
        assert [s for s, _ in ours] == [s for s, _ in theirs] == ([1, 2, 3, 4] if key == "loss" else [2, 4])
        assert all(math.isclose(a, b, rel_tol=1e-5) for (_, a), (_, b) in zip(ours, theirs)), \
            (key, ours, theirs)
        if key in ("hellaswag", "core"):
            assert [v for _, v in ours] == [v for _, v in theirs]
    assert [rec["hellaswag_n"] for rec in got if "hellaswag_n" in rec] == [7, 7]
