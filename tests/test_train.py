"""train_gpt2.py through its real entry points (python and torchrun, gloo) on tiny CPU configurations."""
import dataclasses
import glob
import math
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

from conftest import (ENV, MODERN, MODERN_RUN, ROOT, SCRIPT, TINY, assert_one_line_error, final_weights, loss_steps,
                      losses, records, run_args, train)
from gptlib import checkpoint, settings
from gptlib.checkpoint import checkpoints
from gptlib.errors import UserError, valid_range
from gptlib.optimizers import get_lr
import train_gpt2


# ------------------------------------------------------------------------------------------------ runs

@pytest.mark.slow
def test_tiny_run_on_input_txt(tmp_path, monkeypatch, capsys):
    """No data_root given and no edu_fineweb10B/ here: trains on input.txt (said aloud), on the CPU."""
    log = str(tmp_path / "log")
    monkeypatch.chdir(tmp_path)
    assert train_gpt2.main(TINY + ["--max_steps=30", "--eval_interval=15", "--checkpoint_interval=15",
                                   f"--log_dir={log}"]) == 0
    said = capsys.readouterr().out
    assert ("NOTE: presets input.txt (no shards in edu_fineweb10B/, which `python fineweb.py` makes: training "
            "on input.txt); laptop (no CUDA device: training on the CPU) (the command's shape, whole: n_layer=2, "
            "n_head=2, n_kv_head=2, n_embd=32; theirs left out): data_root=") in said
    recs = records(log)
    start = recs[0]
    assert start["event"] == "start" and start["config"]["data_root"] == settings.SHAKESPEARE
    assert (start["config"]["device"], start["config"]["dtype"]) == ("cpu", "fp32")  # what ran, not "auto"
    assert start["config"]["n_layer"] == 2 and start["config"]["max_steps"] == 30  # the command line's, kept
    assert start["notes"][0].startswith("presets input.txt (") and "n_layer=4" not in start["notes"][0]
    assert start["source"]["data_root"] == "the input.txt preset"  # where each setting came from
    assert start["source"]["n_layer"] == start["source"]["max_steps"] == "this command"
    assert "muon_lr" not in start["source"]  # the block's: not listed
    loss = losses(log)
    assert sorted(loss) == list(range(1, 31))
    assert sum(loss[s] for s in range(26, 31)) / 5 < sum(loss[s] for s in range(1, 6)) / 5 - 1.0  # it learns
    vals = [r for r in recs if "val_loss" in r]
    assert [v["step"] for v in vals] == [15, 30] and vals[1]["val_loss"] < vals[0]["val_loss"]
    samples = [r for r in recs if "samples" in r]
    assert len(samples) == 2 and all(s.startswith("Hello, I'm a language "
                                                  "model,") for s in samples[0]["samples"])
    assert [os.path.basename(p) for p in checkpoints(log)] == ["model_000015.pt", "model_000030.pt"]
    ckpt = final_weights(log)  # torch.load(weights_only=True) works
    assert ckpt["step"] == 30 and ckpt["config"]["max_steps"] == 30 and ckpt["world_size"] == 1
    assert ckpt["dataloader"]["row"] > 0 and len(ckpt["checksum"]) == 64
    assert not any(k.startswith(("_orig_mod.", "module.")) for k in ckpt["model"])
    assert {"optimizer", "rng", "model_config"} <= set(ckpt)
    for r in recs:
        if "loss" in r and "event" not in r:
            assert {"lr", "grad_norm", "ms", "tok_s", "mfu"} <= set(r)
            assert r["mfu"] is None and r["peak_memory"] is None  # no GPU: no peak FLOPs, no CUDA memory


def start_and_signal(args, cwd, log_dir, after_step, sig):
    p = subprocess.Popen([sys.executable, SCRIPT] + args, cwd=cwd, env=ENV, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    path = os.path.join(log_dir, "metrics.jsonl")
    deadline = time.time() + 300
    while time.time() < deadline and p.poll() is None:
        if os.path.exists(path) and max(losses(log_dir), default=0) >= after_step:
            break
        time.sleep(0.02)
    p.send_signal(sig)
    out = p.communicate()[0]
    return p.returncode, out


@pytest.mark.slow
def test_sigint_then_resume_with_a_smaller_micro_batch(tmp_path, text, reference):
    """Ctrl-C (exit 130), then the same run with B=2 instead of 4, as after running out of memory elsewhere:
    twice the accumulation steps, the same rows of data, the same validation rows, the same losses."""
    ref_losses, _, ref_log = reference
    log = str(tmp_path / "log")
    code, out = start_and_signal(run_args(text) + [f"--log_dir={log}"], tmp_path, log, 3, signal.SIGINT)
    assert code == 128 + signal.SIGINT, out
    stopped = max(losses(log))
    assert train_gpt2.main(run_args(text) + [f"--log_dir={log}", "--B=2"]) == 0
    start = [rec for rec in records(log) if rec.get("event") == "start"][-1]
    # as used: twice the accumulation steps (total_batch_size stays), validating the same rows
    assert start["step"] == stopped and start["config"]["B"] == 2 and start["config"]["val_tokens"] == 256
    got = losses(log)
    assert sorted(got) == list(range(1, 9))
    for s in range(stopped + 1, 9):  # another split of the same batch: equal up to float rounding
        assert math.isclose(got[s], ref_losses[s], rel_tol=1e-5), (s, got[s], ref_losses[s])
    val = {rec["step"]: rec["val_loss"] for rec in records(log) if "val_loss" in rec}
    ref_val = {rec["step"]: rec["val_loss"] for rec in records(ref_log) if "val_loss" in rec}
    assert math.isclose(val[8], ref_val[8], rel_tol=1e-5)  # validated on the same rows as before
    # the run's training time goes on from the checkpoint's (not from 0), and the ETA ends at 0
    steps = [rec for rec in records(log) if "elapsed" in rec]
    elapsed = {rec["step"]: rec["elapsed"] for rec in steps}
    assert all(elapsed[k] < elapsed[k + 1] for k in range(1, 8)) and steps[-1]["eta"] == 0


@pytest.mark.slow
def test_sigusr1_checkpoints_then_a_damaged_checkpoint_is_skipped(tmp_path, capsys, text, reference):
    """SIGUSR1 (Slurm's warning before the time limit; SIGTERM and Ctrl-C share its handler, and SIGTERM's
    status is test_one_run_per_log_dir's) finishes the step, writes a checkpoint and exits 138. Bytes changed
    inside that newest checkpoint: the resume says so, takes the one before and ends bit for bit where the
    uninterrupted run ended. With every checkpoint truncated: one line, exit 1, nothing trained."""
    ref_losses, ref_weights, _ = reference
    log = str(tmp_path / "log")
    code, out = start_and_signal(run_args(text) + [f"--log_dir={log}"], tmp_path, log, 3, signal.SIGUSR1)
    assert code == 128 + signal.SIGUSR1, out  # 138: the job script sees the run did not finish
    stopped = max(losses(log))
    assert f"stopped by SIGUSR1 after step {stopped}" in out and stopped < 8
    assert "SIGUSR1: stopping after this step with a checkpoint; SIGUSR1 again stops now without one" in out
    *_, older, newest = checkpoints(log)
    assert os.path.basename(newest) == f"model_{stopped:06d}.pt"
    with open(newest, "r+b") as f:  # random bytes somewhere in the middle (tensor data, most likely)
        f.seek(os.path.getsize(newest) // 2)
        f.write(os.urandom(64))
    assert train_gpt2.main(run_args(text) + [f"--log_dir={log}"]) == 0
    said = capsys.readouterr().out
    assert f"NOTE: checkpoint {newest} is damaged: " in said and f"resuming from {older}" in said
    # moved aside, not counted among the 2 kept: rotation never deletes a good one for it
    assert os.path.exists(newest + ".damaged") and f"moved aside to {os.path.basename(newest)}.damaged" in said
    assert [os.path.basename(p) for p in checkpoints(log)] == ["model_000006.pt", "model_000008.pt"]
    assert losses(log) == ref_losses and loss_steps(log) == list(range(1, 9))
    w = final_weights(log)["model"]
    assert all(torch.equal(w[k], ref_weights[k]) for k in ref_weights)
    for path in checkpoints(log):
        with open(path, "r+b") as f:
            f.truncate(os.path.getsize(path) // 3)
    with pytest.raises(UserError, match=f"none of the 2 checkpoints in {log} verifies.*--log_dir=NEW"):
        train_gpt2.main(run_args(text) + [f"--log_dir={log}", "--max_steps=10"])
    assert capsys.readouterr().out.count("cannot be read") == 2 and max(losses(log)) == 8
    assert checkpoints(log) == [] and len(glob.glob(f"{log}/model_*.pt.damaged")) == 3  # as when one verifies
    with pytest.raises(UserError, match="holds only damaged checkpoints .*--log_dir=NEW$"):  # not a fresh start
        train_gpt2.main(run_args(text) + [f"--log_dir={log}", "--max_steps=10"])


@pytest.mark.slow
def test_finished_run_and_changed_shape(tmp_path, capsys, text, reference):
    """A copy of the finished reference run: rerunning it does nothing; a new model shape or sequence length
    is refused (naming each change and both ways out) and touches nothing."""
    _, _, ref_log = reference
    log = tmp_path / "log"
    shutil.copytree(ref_log, log)
    before = {p: open(p, "rb").read() for p in glob.glob(str(log / "*"))}
    assert train_gpt2.main(run_args(text) + [f"--log_dir={log}"]) == 0
    assert f"the run in {log} is already finished at step 8" in capsys.readouterr().out
    with pytest.raises(UserError, match=r"n_layer=2 \(now 3, this command\), T=32 \(now 16, this command\).*--n_layer=2 --T=32\)"
                                        r".*--log_dir=NEW"):
        train_gpt2.main(run_args(text) + [f"--log_dir={log}", "--n_layer=3", "--T=16", "--max_steps=10"])
    assert {p: open(p, "rb").read() for p in glob.glob(str(log / "*"))} == before  # nothing touched
    # a later command (--max_steps=10) wrote a newer checkpoint, since damaged: step 8's settings run, and
    # the line says how to go on
    (log / "model_000010.pt").write_bytes(b"PK, cut short")
    assert train_gpt2.main([f"--log_dir={log}"]) == 0
    said = capsys.readouterr().out
    assert "model_000010.pt is damaged" in said and (log / "model_000010.pt.damaged").exists()
    assert ("already finished at step 8 (max_steps=8): nothing to do. Raise --max_steps to train further, or "
            "start afresh with --log_dir=NEW\n") in said


@pytest.mark.slow
def test_fp16_loss_scaling_skips_and_resumes_exactly(tmp_path, capsys, text):
    """--dtype=fp16 on the CPU: too high a first loss scale overflows the fp16 gradients; those steps are
    logged as skipped (not taken for a diverged run) while the scale halves, then training goes on. The
    scaler's state is in the checkpoint: a SIGKILL and resume give the uninterrupted run's losses and weights,
    bit for bit."""
    # fp16 matmuls are slow on CPUs: a quarter of run_args' tokens, still 2 micro-steps a step
    args = run_args(text) + ["--dtype=fp16", "--loss_scale=1048576", "--T=16", "--total_batch_size=128"]
    ref = tmp_path / "ref"
    assert train_gpt2.main(args + [f"--log_dir={ref}"]) == 0
    said = capsys.readouterr().out
    recs = [rec for rec in records(ref) if "loss" in rec and "event" not in rec]
    skipped = [rec["step"] for rec in recs if rec["skipped"]]
    assert skipped and skipped == list(range(1, len(skipped) + 1)) and len(skipped) < 6, skipped
    n = len(skipped) + 1
    assert [rec["loss_scale"] for rec in recs[:n]] == [2 ** (20 - i) for i in range(n)]
    assert "skipped: fp16 gradients overflowed at loss scale 1.04858e+06" in said
    assert "non-finite" not in said
    assert recs[-1]["loss"] < recs[len(skipped)]["loss"]  # it trains after the skips
    assert final_weights(ref)["scaler"]["scale"] == 2 ** (20 - len(skipped))
    log = str(tmp_path / "log")
    code, _ = start_and_signal(args + [f"--log_dir={log}"], tmp_path, log, 5, signal.SIGKILL)
    assert code == -signal.SIGKILL
    assert train_gpt2.main(args + [f"--log_dir={log}"]) == 0
    assert losses(log) == losses(ref)
    w, w_ref = final_weights(log)["model"], final_weights(ref)["model"]
    assert all(torch.equal(w[k], w_ref[k]) for k in w_ref)


@pytest.mark.slow
def test_a_run_without_loss_scaling_resumes_in_fp16(tmp_path, capsys, text):
    """Started in bf16 or fp32 (an H100), resumed where dtype=auto picks fp16 (a V100 or T4): the checkpoint
    holds no loss scale to continue, so the scale starts fresh, with a NOTE, and the run goes on."""
    args = TINY + [f"--data_root={text}", "--checkpoint_interval=2", f"--log_dir={tmp_path}"]
    assert train_gpt2.main(args + ["--max_steps=2"]) == 0
    capsys.readouterr()
    assert train_gpt2.main(args + ["--max_steps=3", "--dtype=fp16", "--T=32"]) == 0
    said = capsys.readouterr().out
    assert "NOTE: model_000002.pt was written by a run without fp16 loss scaling: the loss scale starts at " \
           "65536 (--loss_scale)" in said, said
    assert sorted(losses(str(tmp_path))) == [1, 2, 3]


@pytest.mark.slow
def test_modern_recipe_trains_and_resumes_exactly_after_sigkill(tmp_path, capsys, text, reference,
                                                               modern_reference):
    """--recipe=modern: an untied lm_head (saved as itself, not re-tied to wte), rotary positions (no wpe) and
    the other options, with Muon (block matrices) + AdamW (the rest) and gradient accumulation. Both
    optimizers' states are in the checkpoint, so a SIGKILL and the same command again give the uninterrupted
    run's losses and weights bit for bit; the log keeps one record per step. A resume cannot switch the recipe
    or the optimizer back (one line)."""
    ref = losses(modern_reference)
    assert ref != reference[0] and ref[8] < ref[1]  # another recipe than GPT-2's, and it learns
    ckpt = final_weights(modern_reference)
    state = ckpt["optimizer"]["state"]
    assert "momentum_buffer" in state["transformer.h.0.attn.c_attn.weight"]  # Muon's
    assert all("exp_avg" in state[k] for k in ("transformer.wte.weight", "lm_head.weight",
                                               "transformer.h.0.attn.c_attn.bias"))  # AdamW's
    assert ckpt["model_config"]["untied_head"] and ckpt["model_config"]["rotary"]
    # every AdamW group follows the schedule from its own peak: head_lr's (x sqrt(768 / n_embd)), max_lr's
    lr = {name: g["lr"] for g in ckpt["optimizer"]["param_groups"] for name in g["params"]}
    peak = {"lm_head.weight": 0.004 * (768 / ckpt["model_config"]["n_embd"]) ** 0.5,
            "transformer.h.0.attn.c_attn.bias": ckpt["config"]["max_lr"]}
    assert lr["lm_head.weight"] / lr["transformer.h.0.attn.c_attn.bias"] == pytest.approx(
        peak["lm_head.weight"] / peak["transformer.h.0.attn.c_attn.bias"])
    assert lr["lm_head.weight"] < peak["lm_head.weight"]  # the cosine's, not the peak
    assert "transformer.wpe.weight" not in ckpt["model"]
    assert not torch.equal(ckpt["model"]["lm_head.weight"], ckpt["model"]["transformer.wte.weight"])
    log = str(tmp_path / "log")
    code, _ = start_and_signal(run_args(text) + MODERN_RUN + [f"--log_dir={log}"], tmp_path, log, 5,
                               signal.SIGKILL)
    assert code == -signal.SIGKILL and 5 <= max(losses(log)) < 8  # killed part way
    assert train_gpt2.main(run_args(text) + MODERN_RUN + [f"--log_dir={log}"]) == 0
    said = capsys.readouterr().out
    assert "resuming from" in said and "NOTE: dropped" in said  # the killed attempt's steps after it
    assert losses(log) == ref  # bitwise: floats compared exactly
    assert loss_steps(log) == list(range(1, 9))  # one record per step in the file itself
    starts = [rec for rec in records(log) if rec.get("event") == "start"]
    assert len(starts) == 2 and starts[1]["step"] in (4, 6)  # the log was appended, not truncated
    w, w_ref = final_weights(log)["model"], ckpt["model"]
    assert w.keys() == w_ref.keys() and all(torch.equal(w[k], w_ref[k]) for k in w_ref)
    with pytest.raises(UserError, match=r"has recipe='modern' \(now 'gpt2', this command\), which a resume cannot "
                                        r"change: restore it \(--recipe=modern\).*--log_dir=NEW$"):
        train_gpt2.main([f"--log_dir={log}", "--max_steps=9", "--recipe=gpt2"])  # GPT-2's recipe


@pytest.mark.parametrize("case", ["bad shard", "missing hellaswag", "bad init_from"])
def test_mistakes_in_model_and_data_stop_in_one_line(tmp_path, monkeypatch, text, case):
    """Found while the model and data are built: a UserError with the one-line message (what the entry point
    prints, tested through it for the resume mistakes), and no log_dir left behind."""
    from dataloader import shard_path, write_shard
    monkeypatch.chdir(tmp_path)
    args = TINY + [f"--log_dir={tmp_path / 'log'}", "--max_steps=2", f"--data_root={text}"]
    if case == "bad shard":
        write_shard(shard_path(tmp_path, "s", "val", 0), list(range(5000)))
        with open(shard_path(tmp_path, "s", "train", 1), "wb") as f:
            f.write(b"not a shard" * 200)
        args.append(f"--data_root={tmp_path}")
        match = r".*s_train_000001.bin is not a token shard \(bad magic number\).*fineweb.py"
    elif case == "missing hellaswag":
        args += ["--hellaswag=5", f"--hellaswag_data={tmp_path / 'hs.jsonl'}"]
        match = ".*hs.jsonl does not exist"
    else:
        args.append(f"--init_from={tmp_path}")
        match = ".*config.json does not exist"
    with pytest.raises(UserError, match=match) as e:
        train_gpt2.main(args)
    assert "\n" not in str(e.value)
    assert not os.path.exists(tmp_path / "log")  # and no empty log_dir left behind


def test_what_a_resume_may_change():
    """A resume runs the run's saved settings with the block's lines edited since the command that wrote the
    checkpoint and this command's flags, each change said with where it came from; what it cannot change (the
    model, the data stream, the optimizer) is one UserError naming each and both ways out."""
    from types import SimpleNamespace
    from gptlib.runtime import Runtime
    block = train_gpt2.CONFIG
    saved = dict(block, B=4, max_lr=1e-2, embed_lr=0.01, recipe="modern", optimizer="muon", n_layer=4)
    model = dataclasses.asdict(settings.model_shape(saved))
    meta = {"config": saved, "block": block, "model_config": model}
    cfg, source, _ = settings.continued(block, meta, {"max_steps": 3}, "log")  # the run's, not the block's
    assert {k: cfg[k] for k in ("B", "max_lr", "embed_lr", "optimizer", "n_layer", "max_steps")} == {
        "B": 4, "max_lr": 1e-2, "embed_lr": 0.01, "optimizer": "muon", "n_layer": 4, "max_steps": 3}
    edited = dict(block, weight_decay=0.2)  # a line edited since: applied; one undone since: applied too
    cfg, source, _ = settings.continued(edited, meta, {"embed_lr": 0.2}, "log")
    assert (cfg["weight_decay"], source["weight_decay"], source["embed_lr"]) == (0.2, "the settings block",
                                                                                 "this command")
    assert set(source) == {"weight_decay", "embed_lr", "device", "dtype", "collective_timeout"}
    cfg, _, _ = settings.continued(block, {**meta, "block": edited}, {}, "log")
    assert cfg["weight_decay"] == block["weight_decay"]
    cfg, _, _ = settings.continued(block, {"config": saved, "model_config": model}, {}, "log")  # no block kept
    assert cfg == saved
    s = train_gpt2.Settings(**dict(cfg, B=2, embed_lr=0.2, max_lr=1e-3, device="cpu", dtype="fp32"))
    resume = SimpleNamespace(meta={"config": saved, "world_size": 2, "evaluated": True}, step=0)
    said = settings.changes(resume, s, {"B": "a fit to 1 process", "embed_lr": "this command"}, Runtime())
    assert said[0] == ("changed since the checkpoint: B 4 -> 2 (a fit to 1 process), max_lr 0.01 -> 0.001 "
                       "(this machine), embed_lr 0.01 -> 0.2 (this command)")
    assert said[1] == "processes changed since the checkpoint: 2 -> 1"
    assert said[2].startswith("the learning rate of step 1 is 1.40e-06 on the new schedule, 1.40e-05 on the")
    for key, value in [("vocab_size", 512), ("n_kv_head", 1), ("shuffle", True), ("total_batch_size", 1024),
                       ("data_root", "other.txt"), ("seed", 1), ("block_size", 64), ("optimizer", "adamw"),
                       ("T", 512), ("rotary", True), ("init_from", "gpt2"), ("recipe", "gpt2"), ("size", "124M")]:
        with pytest.raises(UserError, match=f"^the run in log has {key}={saved[key]!r} \\(now {value!r}, this "
                                            f"command\\), which a resume cannot change: restore it \\(--{key}="):
            settings.continued(block, meta, {key: value}, "log")
    with pytest.raises(UserError, match=r"has n_layer=4 \(now 6, the settings block\), .*--log_dir=NEW$"):
        settings.continued(dict(block, n_layer=6), meta, {}, "log")
    # --init_from=resume is the run's own origin; a model field added since (a block line the checkpoint's
    # settings and block lack) has the weights' value, not the block's
    old = {k: v for k, v in saved.items() if k != "rotary"}
    ran = {k: v for k, v in block.items() if k != "rotary"}
    cfg, _, _ = settings.continued(block, {"config": old, "block": ran, "model_config": model},
                                   {"init_from": "resume"}, "log")
    assert cfg["init_from"] == "scratch" and cfg["rotary"] is False
    with pytest.raises(UserError, match=r"has rotary=False \(now True, the settings block\)"):  # a line added
        settings.continued(dict(block, rotary=True), {"config": old, "block": ran, "model_config": model}, {}, "log")
    # the fits to a machine (B to its GPU, eager where torch.compile failed) are not the run's: made again
    fitted = {**meta, "settings": dict(saved, compile=True, B=64), "config": dict(saved, compile=False, B=16)}
    cfg, _, _ = settings.continued(block, fitted, {}, "log")
    assert (cfg["compile"], cfg["B"]) == (True, 64)
    # this machine's device, dtype and collective timeout are the block's and this command's, said as such
    cfg, source, _ = settings.continued(block, {**meta, "config": dict(saved, dtype="fp16")}, {}, "log")
    assert cfg["dtype"] == "auto" and source["dtype"] == "the settings block"


def test_non_finite_loss_stops_and_keeps_last_checkpoint(tmp_path, capsys, text):
    """A loss that overflows stops the run before that step's update (exit status 1), logged, naming the
    newest checkpoint: the last good step's, whose weights are finite."""
    log = str(tmp_path / "log")
    status = train_gpt2.main(TINY + [f"--data_root={text}", "--max_steps=20", "--warmup_steps=1",
                                     "--max_lr=1e30", "--checkpoint_interval=1", "--eval_interval=100",
                                     f"--log_dir={log}"])
    assert status == 1
    bad = [rec for rec in records(log) if rec.get("event") == "non-finite"]
    assert len(bad) == 1 and max(losses(log)) == bad[0]["step"] - 1
    last = final_weights(log)  # the newest checkpoint is the last good step, loadable
    assert last["step"] == bad[0]["step"] - 1 and all(torch.isfinite(v).all() for v in last["model"].values())
    out = capsys.readouterr().out
    assert (f"at step {bad[0]['step']}: stopped before its update. Lower --max_lr or check the data, then "
            f"rerun: it resumes from model_{last['step']:06d}.pt (step {last['step']})") in out, out


# ------------------------------------------------------------------------------------------------ settings

def decide(tmp_path, given, rt, Settings=None):
    """settings.resolve of this command's flags (given) into a fresh log_dir under tmp_path on runtime rt."""
    given = {"log_dir": str(tmp_path / "log"), "compile": False, **given}
    return settings.resolve(Settings or train_gpt2.Settings, given, rt)


@pytest.mark.parametrize("kind, world_size", [("cuda", 1), ("cuda", 8), ("cpu", 1), ("cpu", 2), ("mps", 1)])
def test_fallback_settings_fit_input_txt(tmp_path, monkeypatch, kind, world_size):
    """No shards (and maybe no GPU): the presets chosen make a valid run on input.txt, with a batch of the
    same number of tokens whatever the number of processes (B is lowered to keep it whole), so a resume may
    change B or the number of processes. Under torchrun, missing shards are a mistake, not a demo. An Apple
    GPU (a faked mps) trains the laptop's model, said as such, eager in fp32."""
    from dataloader import DataLoaderLite
    from gptlib.runtime import Runtime
    monkeypatch.chdir(tmp_path)  # no edu_fineweb10B/ here
    rt = Runtime(world_size=world_size, kind=kind, device=kind)
    s, _, origin = decide(tmp_path, {}, rt)
    assert s.data_root == settings.SHAKESPEARE and s.device == kind and s.dtype == "fp32"
    where = {"cuda": None, "cpu": "the CPU", "mps": "an Apple GPU (mps)"}[kind]
    presets = origin["notes"][0]
    assert presets.startswith("presets input.txt (no shards in edu_fineweb10B/, which `python fineweb.py` "
                              "makes: training on input.txt)" + (f"; laptop (no CUDA device: training on "
                                                                 f"{where})" if where else ""))
    assert s.total_batch_size == (4096 if kind == "cuda" else 2048)
    assert (s.n_embd, s.compile) == ((768, False) if kind == "cuda" else (64, False))
    assert s.total_batch_size % (s.B * s.T * world_size) == 0 and s.T <= s.block_size
    for split in ("train", "val"):  # raises if a split is shorter than one step
        DataLoaderLite(s.B, s.T, world_size - 1, world_size, split, s.data_root)
    s, _, _ = decide(tmp_path, {"B": 2}, rt)
    assert s.B == 2 and s.total_batch_size == (4096 if kind == "cuda" else 2048)  # the command line wins
    rt.distributed = True  # under torchrun rank 0's view of log_dir decides (one process here: its own)
    monkeypatch.setattr(settings, "broadcast_object", lambda obj, group=None: obj)
    where = tmp_path / "edu_fineweb10B"
    with pytest.raises(UserError, match=rf"no shards in {where} \(data_root is relative to the directory "
                                         r"you run from\): make them there with `python fineweb.*"
                                         r"--data_root=input.txt"):
        decide(tmp_path, {}, rt)
    from dataloader import DataLoaderLite as Loader  # a file named that is not there: no shard advice
    with pytest.raises(UserError, match=r"data_root nope.txt does not exist: check the path") as e:
        Loader(2, 8, data_root="nope.txt")
    assert "fineweb.py" not in str(e.value)


def test_the_presets_set_settings_of_the_block():
    """Every setting a preset sets is a line of the settings block (a preset cannot invent one)."""
    presets = [*settings.SIZES.values(), *settings.RECIPES.values(), settings.LAPTOP, settings.SHAKESPEARE_CONFIG]
    assert {k for preset in presets for k in preset} <= set(train_gpt2.CONFIG)


def test_size_and_recipe_presets(tmp_path, text):
    """The block, then the presets (a size, a recipe, the laptop's), then the command line; a shape the command
    names is that shape, whole (GPT-2's 12 heads with its n_layer and n_embd on a CPU, not the laptop's 4)."""
    from gptlib.runtime import Runtime
    from model import GPTConfig
    gpu, cpu = Runtime(kind="cuda", device="cuda"), Runtime()
    shape = ("n_layer", "n_head", "n_kv_head", "n_embd", "max_lr")
    for rt in (gpu, cpu):  # the size's shape with the command's n_layer, and the size's max_lr
        s, _, origin = decide(tmp_path, {"size": "350M", "n_layer": 4, "data_root": text}, rt)
        assert tuple(getattr(s, k) for k in shape) == (4, 16, 16, 1024, 3e-4)
        assert origin["source"]["n_embd"] == "the --size=350M preset" and origin["source"]["n_layer"] == "this command"
    s, _, origin = decide(tmp_path, {"n_layer": 12, "n_embd": 768, "data_root": text}, cpu)
    assert (s.n_layer, s.n_head, s.n_kv_head, s.n_embd, s.T) == (12, 12, 12, 768, 128)  # T: the laptop's
    assert origin["notes"][0].startswith("presets laptop (no CUDA device: training on the CPU); --recipe=modern "
                                         "(the command's shape, whole: n_layer=12, n_head=12, n_kv_head=12, "
                                         "n_embd=768; theirs left out): ")  # the block's heads, named
    assert "n_head=4" not in origin["notes"][0]
    for size, (layers, width) in {"124M": (12, 768), "774M": (36, 1280), "1558M": (48, 1600)}.items():
        s, _, _ = decide(tmp_path, {"size": size, "data_root": text}, gpu)
        assert (s.n_layer, s.n_embd) == (layers, width) and s.n_embd % s.n_head == 0
    s, _, origin = decide(tmp_path, {"data_root": text}, gpu)  # "": the settings as they are
    ours = ("data_root", "log_dir", "compile", "val_tokens")  # this command's, and the split's fit
    assert {k: v for k, v in dataclasses.asdict(s).items() if k not in ours + ("device", "dtype")} == {
        k: v for k, v in train_gpt2.CONFIG.items() if k not in ours + ("device", "dtype")}
    assert not any(note.startswith("presets") for note in origin["notes"]) and set(origin["source"]) == set(ours)
    # the modern recipe: its options, Muon and its max_lr, each still overridable; GPT-2's is the default
    s, _, origin = decide(tmp_path, {"recipe": "modern", "rotary": False, "data_root": text}, gpu)
    assert s.optimizer == "muon" and s.max_lr == 6e-3 and origin["source"]["max_lr"] == "the --recipe=modern preset"
    assert s.head_lr == s.embed_lr == 0.004 and train_gpt2.CONFIG["head_lr"] == 0
    assert not s.rotary and all(getattr(s, k) for k in MODERN if k != "rotary")
    assert train_gpt2.CONFIG["recipe"] == "gpt2" and not any(train_gpt2.CONFIG[k] for k in MODERN)
    s, _, _ = decide(tmp_path, {"recipe": "gpt2", "data_root": text}, cpu)  # on a CPU: its laptop rate
    assert (s.recipe, s.optimizer, s.rotary, s.max_lr, s.n_embd) == ("gpt2", "adamw", False, 3e-3, 64)
    with pytest.raises(UserError, match="--recipe='new': use one of gpt2, modern"):
        decide(tmp_path, {"recipe": "new", "data_root": text}, gpu)
    from gptlib.accounting import count_params  # the presets are GPT-2's sizes
    for size, n in {"124M": 124_439_808, "350M": 354_823_168, "774M": 774_030_080,
                    "1558M": 1_557_611_200}.items():
        p = settings.SIZES[size]
        assert count_params(GPTConfig(n_layer=p["n_layer"], n_head=p["n_head"], n_embd=p["n_embd"])) == n


def test_lr_schedule():
    s = train_gpt2.Settings(min_lr_ratio=0.1, warmup_steps=10, max_steps=110)
    assert get_lr(0, 1.0, s) == 0.1 and get_lr(9, 1.0, s) == 1.0
    assert math.isclose(get_lr(60, 1.0, s), 0.55)
    assert math.isclose(get_lr(110, 1.0, s), 0.1)
    assert all(get_lr(i, 1.0, s) >= get_lr(i + 1, 1.0, s) for i in range(10, 120))
    assert get_lr(60, 0.004, s) == pytest.approx(0.004 * 0.55)  # each role from its own peak


@pytest.mark.slow
def test_help_lists_every_setting_from_the_settings_block():
    """python train_gpt2.py --help: every setting with its default and its comment, read from the settings
    block itself, exit 0."""
    r = subprocess.run([sys.executable, SCRIPT, "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    listed = {line.split("=")[0].strip()[2:]: line
              for line in r.stdout.splitlines() if line.startswith("  --")}
    assert list(listed) == list(train_gpt2.CONFIG)
    with open(SCRIPT) as f:
        source = f.read()
    for name, line in listed.items():
        default, _, comment = line.partition("=")[2].partition(" ")
        assert default == repr(train_gpt2.CONFIG[name]) and comment.strip(), line
        assert comment.split()[0] in source.split(f"\n{name} = ")[0].rsplit("\n\n", 1)[-1] + \
            source.split(f"\n{name} = ")[1].split("\n")[0], line
        if name in settings.RANGES:  # what check_range refuses outside, in its words
            assert line.endswith(f"({valid_range(*settings.RANGES[name])})"), line
    assert listed["min_lr_ratio"].endswith("(between 0 and 1)") and listed["max_lr"].endswith("(above 0)")


def test_overrides_are_checked():
    argv = ["--B=8", "--max_lr", "1e-3", "--compile=false", "--total_batch_size=5.24288e5", "--log_dir", "x"]
    got = settings.parse_overrides(argv, train_gpt2.Settings, SCRIPT)
    assert got == {"B": 8, "max_lr": 1e-3, "compile": False, "total_batch_size": 524288, "log_dir": "x"}
    for argv, match in [(["--max_lrr=1"], "unknown setting 'max_lrr'; did you mean --max_lr?"),
                        (["--lr=1e-3"], "unknown setting 'lr'; did you mean --max_lr?"),  # a part of a name
                        (["--B=eight"], "--B='eight' is not a whole number"), (["--B=2.5"], "is not a whole"),
                        (["--compile=maybe"], "is not True or False"), (["B=3"], "expected --name=value"),
                        (["--B", "--T=3"], "--B needs a value: --B=VALUE")]:
        with pytest.raises(UserError, match=match):
            settings.parse_overrides(argv, train_gpt2.Settings, SCRIPT)


@pytest.mark.parametrize("argv, match", [
    (["--total_batch_size=1000"],
     r"total_batch_size=1,000 is not a multiple of T\*world_size = 32\*1 = 32: use a multiple of it, such "
     "as 992"),
    (["--total_batch_size=96"],
     "--B=4 does not divide total_batch_size=96 into whole micro-steps of 32 tokens x 1 process: use one "
     "of 3, 1"),
    (["--T=2048"], "T=2048 exceeds block_size=1024"),
    (["--data_root=nowhere"], "data_root nowhere does not exist"),
    (["--device=tpu"], "--device='tpu': use auto, cuda, mps or cpu"),
    (["--init_from=resume"], "holds no checkpoint"),
    (["--keep_checkpoints=0"], "--keep_checkpoints=0 must be at least 1"),
    (["--eval_interval=0"], "--eval_interval=0 must be at least 1"),
    (["--fsdp=True"], "run it as `torchrun --nproc_per_node=N train_gpt2.py --fsdp=True`"),
    (["--size=2B"], "--size='2B': use one of 124M, 350M, 774M, 1558M"),
    (["--device=mps"], "--device=mps but torch sees no mps device here"),
    (["--dtype=fp8"], "--dtype='fp8': use auto, bf16, fp16 or fp32"),
    (["--optimizer=sgd"], "--optimizer='sgd': use adamw or muon"),
    (["--val_tokens=31"], "--val_tokens=31 is less than one row of T=32 tokens: give at least 32"),
    (["--optimizer=muon", "--fsdp=True"], "--optimizer=muon does not work with --fsdp=True: .* drop --fsdp"),
])
def test_bad_settings(tmp_path, argv, match):
    with pytest.raises(UserError, match=match):
        train_gpt2.main(TINY + [f"--log_dir={tmp_path}"] + argv)


def test_an_older_torch_is_a_note_and_fsdp_on_it_one_line(tmp_path, monkeypatch, capsys, text):
    """The whole suite passes from torch 2.9 (requirements.txt). On an older one (faked here) a run starts
    with a NOTE saying so, and --fsdp=True is refused in one line naming the version: 2.6's FSDP2 fails on
    the CPU, and 2.7's and 2.8's sum the gradients over gloo instead of averaging them. A build of 2.9 itself
    (NVIDIA's containers name it 2.9.0a0+git...) is 2.9."""
    from gptlib.runtime import MIN_TORCH, torch_older_than
    assert MIN_TORCH == (2, 9)
    monkeypatch.setattr(torch, "__version__", "2.9.0a0+50eac811a6")
    assert not torch_older_than(MIN_TORCH)
    monkeypatch.setattr(torch, "__version__", "2.8.0+cu128")
    assert torch_older_than(MIN_TORCH) and not torch_older_than((2, 8))
    with pytest.raises(UserError, match=r"--fsdp=True needs torch >= 2.9 .*this is 2.8.0\+cu128: upgrade "
                                        r"torch or drop --fsdp"):
        train_gpt2.main(TINY + [f"--log_dir={tmp_path / 'fsdp'}", "--fsdp=True"])
    assert train_gpt2.main(TINY + [f"--data_root={text}", "--max_steps=1", f"--log_dir={tmp_path / 'run'}"]) \
        == 0
    assert ("NOTE: torch 2.8.0+cu128 is older than 2.9, the oldest this project is tested on: pip install -r "
            "requirements.txt upgrades it") in capsys.readouterr().out


@pytest.mark.slow
def test_scratch_into_a_run_continues_it_and_weights_are_refused(tmp_path, capsys, text):
    """--init_from=scratch is a scratch run's own origin: into its log_dir, the run continues (and its line
    says how to start a fresh experiment); --init_from=WEIGHTS there is refused once, and its advice works."""
    log = str(tmp_path / "log")
    assert train_gpt2.main(TINY + [f"--log_dir={log}", f"--data_root={text}", "--max_steps=1"]) == 0
    assert train_gpt2.main(TINY + [f"--log_dir={log}", f"--data_root={text}", "--init_from=scratch",
                                   "--max_steps=2"]) == 0
    assert "resuming from" in capsys.readouterr().out and max(losses(log)) == 2
    with pytest.raises(UserError, match=r"has init_from='scratch' \(now 'gpt2', this command\), which a resume "
                                        r"cannot change: restore it \(--init_from=scratch\)"):
        train_gpt2.main(TINY + [f"--log_dir={log}", "--init_from=gpt2", "--max_steps=3"])
    assert train_gpt2.main(TINY + [f"--log_dir={log}", "--init_from=scratch", "--max_steps=3"]) == 0


# ---------------------------------------------------------------------------------------------- GPU memory

@pytest.mark.parametrize("given", [False, True])
def test_micro_batch_is_fitted_to_the_gpus_memory(tmp_path, monkeypatch, capsys, text, given):
    """Before compiling, B is checked against the GPU's memory (here a fake 'GPU' whose memory holds B=4 but
    not B=8 by the estimate): a B from the settings is lowered to the largest that fits and keeps
    total_batch_size whole, with a NOTE; a B given on the command line is kept, with a warning."""
    from gptlib import runtime
    from gptlib.accounting import training_memory
    from model import GPTConfig
    config = GPTConfig(block_size=1024, vocab_size=50304, n_layer=2, n_head=2, n_embd=32)
    need = {b: training_memory(config, b, 32, "fp32")["total"] for b in (4, 8)}
    memory = int((need[4] + need[8]) / 2 / 0.9)  # 90% of it is the budget
    setup = runtime.setup  # a fake GPU's memory on the CPU
    monkeypatch.setattr(runtime, "setup", lambda **kw: dataclasses.replace(setup(**kw), memory=memory))
    args = [a for a in TINY if not a.startswith("--B=")] + (["--B=8"] if given else [])  # B=8: the fallback's 16, lowered
    train_gpt2.main(args + [f"--data_root={text}", "--max_steps=1", f"--log_dir={tmp_path}"])
    out = capsys.readouterr().out
    said = f"NOTE: B=8 needs an estimated {need[8] / 2**30:.1f} GiB per process of the GPU's"
    assert said in out, out
    start = records(tmp_path)[0]
    if given:
        assert "it may run out of memory; --B=4 fits the estimate" in out
        assert start["config"]["B"] == 8 and "8 x 32 x 1 process x 1 accumulation step;" in out
    else:
        assert "using B=4, the largest that fits (set --B to choose)" in out
        assert start["config"]["B"] == 4 and "4 x 32 x 1 process x 2 accumulation steps" in out
        assert start["source"]["B"] == "a fit to the GPU's memory"
    assert any(said[6:] in note for note in start["notes"])


@pytest.mark.parametrize("wrapped", [False, True, "cpu"])
def test_out_of_memory_is_one_line_naming_a_smaller_B(tmp_path, monkeypatch, text, wrapped):
    """torch.OutOfMemoryError in a step, raised as it is or wrapped by compiled code, or the CPU allocator's
    RuntimeError (its text as torch 2.13 raises it for torch.empty(2**45); not raised for real: a failed
    malloc moves the thread to another of glibc's arenas for good), ends the run with one line naming the B
    to try (the next divisor that keeps total_batch_size whole) and the estimate."""
    import model

    def out_of_memory(self, *args, **kwargs):
        e = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
        if wrapped == "cpu":
            raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate "
                               "memory: you tried to allocate 140737488355328 bytes. Error code 12 (Cannot "
                               "allocate memory)")
        if wrapped:
            raise RuntimeError("backend compiler failed") from e
        raise e
    monkeypatch.setattr(model.GPT, "forward", out_of_memory)
    from gptlib.errors import RankError
    with pytest.raises(RankError) as e:  # one GPU may run out alone: that rank says it (errors.main_guard)
        train_gpt2.main(TINY + [f"--data_root={text}", "--max_steps=2", f"--log_dir={tmp_path}"])
    msg = str(e.value)
    assert msg.startswith("out of memory in step 1 at B=4, T=32 (estimated ") and "\n" not in msg, msg
    assert msg.endswith("GiB per process): try --B=2 (gradient accumulation keeps total_batch_size). No "
                        "checkpoint yet: the same command starts the run again"), msg


@pytest.mark.slow
def test_one_run_per_log_dir(tmp_path, text):
    """A second run into the log_dir of a live one is refused in one line naming the first (it would resume
    from the first's live checkpoint and both would write one log). Ctrl-C is acknowledged at once; a second
    signal right after it stops the process now, without a checkpoint, and the lock goes with the process.
    A --log_dir that is a file is one line too."""
    from filelock import FileLock
    log = str(tmp_path / "log")
    args = TINY + [f"--data_root={text}", "--max_steps=100000", "--checkpoint_interval=100000",
                   f"--log_dir={log}"]
    with open(tmp_path / "out.txt", "w") as out:
        first = subprocess.Popen([sys.executable, SCRIPT] + args, cwd=tmp_path, env=ENV, stdout=out,
                                 stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 120
        while not os.path.exists(os.path.join(log, "metrics.jsonl")) and time.time() < deadline:
            time.sleep(0.05)
        second = train(args, cwd=tmp_path, check=False)
        assert_one_line_error(second, f"error: {log} is in use by another run (pid {first.pid} on ",
                              "choose another --log_dir")
        assert first.poll() is None  # untouched, still training
        first.send_signal(signal.SIGINT)
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        first.kill()
        first.wait()
    said = (tmp_path / "out.txt").read_text()
    assert "Ctrl-C: stopping after this step with a checkpoint; Ctrl-C again stops now without one" in said
    assert "SIGTERM again: stopped now, without a checkpoint" in said
    assert "checkpoint:" not in said and "stopped by" not in said and checkpoints(log) == []
    FileLock(os.path.join(log, ".lock")).acquire(timeout=0)  # released by the OS with the process
    (tmp_path / "afile").write_text("")
    with pytest.raises(UserError, match="is a file, not a directory: choose another --log_dir$"):
        train_gpt2.main(TINY + [f"--data_root={text}", f"--log_dir={tmp_path / 'afile'}"])
    with pytest.raises(UserError, match="^--log_dir is empty: name a folder, such as --log_dir=log$"):
        train_gpt2.main(TINY + [f"--data_root={text}", "--log_dir="])


@pytest.mark.parametrize("status", [0, 143])
@pytest.mark.slow
def test_a_torchrun_process_exits_with_its_status_and_its_output(tmp_path, status):
    """exit_process skips the interpreter's shutdown (which races gloo's worker threads and can abort): the
    exit status and everything printed still come out."""
    worker = os.path.join(ROOT, "tests", "workers", "exit_process.py")
    r = subprocess.run([sys.executable, worker, str(tmp_path / "pg"), str(status)], cwd=ROOT,
                       env={**ENV, "PYTHONPATH": ROOT},
                       capture_output=True, text=True, timeout=120)
    # (torch 2.8 and 2.9's gloo print a line of their own first)
    assert r.returncode == status and r.stdout.endswith("written before the exit"), (r.returncode, r.stderr)


@pytest.mark.slow
def test_validation_reads_the_split_at_most_once(tmp_path, capsys, text):
    """val_tokens beyond the validation split: a NOTE, and the loss of one pass over it (no row counted
    twice). The split of the tiny text holds 55 rows of 32 tokens."""
    from dataloader import DataLoaderLite, split_rows
    args = TINY + [f"--data_root={text}", "--max_steps=1", "--eval_interval=1"]
    assert DataLoaderLite(4, 32, 0, 1, "val", text).rows_total == 55 == split_rows(text, "val", 32)
    train_gpt2.main(args + ["--val_tokens=100000", f"--log_dir={tmp_path / 'many'}"])
    assert ("NOTE: val_tokens=100,000 but the validation split holds 55 rows of 32 tokens: evaluating on "
            "those, once each") in capsys.readouterr().out
    train_gpt2.main(args + [f"--val_tokens={55 * 32}", f"--log_dir={tmp_path / 'once'}"])
    assert "NOTE: val_tokens" not in capsys.readouterr().out
    many, once = ([r for r in records(tmp_path / name) if "val_loss" in r] for name in ("many", "once"))
    assert records(tmp_path / "many")[0]["config"]["val_tokens"] == 55 * 32
    assert many[0]["val_loss"] == once[0]["val_loss"] and many[0]["val_bpb"] == once[0]["val_bpb"]


@pytest.mark.slow
def test_a_mistake_under_torchrun_is_said_once_per_node(tmp_path, text):
    """Every rank finds the same mistake; only local rank 0 prints it, and torchrun ends with status 1."""
    r = train(TINY + [f"--data_root={text}", "--B=0", f"--log_dir={tmp_path / 'log'}"], cwd=tmp_path,
              check=False, nproc=2)
    assert r.returncode == 1 and r.stderr.count("error: --B=0 must be at least 1") == 1, r.stderr[-3000:]
    assert not os.path.exists(tmp_path / "log")


@pytest.mark.slow
def test_a_fine_tune_continues_under_the_same_command(tmp_path, capsys, text, reference):
    """--init_from=<checkpoint> into a new log_dir is a fine-tune. Stopped by Ctrl-C, the same command again
    continues it from its own newest checkpoint (not from the pretrained weights: before, it started over at
    step 1, and rotation then deleted its new checkpoints) and ends where the uninterrupted fine-tune ends,
    bit for bit, one record per step. Other weights into that log_dir are refused and touch nothing; a run
    without --init_from continues it, keeping its origin."""
    _, _, ref_log = reference
    *_, other, weights = checkpoints(ref_log)  # the reference run's final weights, pretrained for this
    args = TINY + [f"--data_root={text}", f"--init_from={weights}", "--max_steps=6",
                   "--checkpoint_interval=2", "--eval_interval=6"]
    assert train_gpt2.main(args + [f"--log_dir={tmp_path / 'whole'}"]) == 0
    log = str(tmp_path / "log")
    code, out = start_and_signal(args + [f"--log_dir={log}"], tmp_path, log, 3, signal.SIGINT)
    assert code == 128 + signal.SIGINT, out
    assert train_gpt2.main(args + [f"--log_dir={log}"]) == 0
    assert losses(log) == losses(tmp_path / "whole") and loss_steps(log) == list(range(1, 7))
    starts = [rec for rec in records(log) if rec.get("event") == "start"]
    assert len(starts) == 2 and starts[1]["step"] in (3, 4) and starts[1]["config"]["init_from"] == weights
    before = {p: open(p, "rb").read() for p in glob.glob(os.path.join(log, "*"))}
    with pytest.raises(UserError, match=f"{log} has init_from='{weights}' \\(now '{other}', this command\\), "
                                        f"which a resume cannot change: restore it \\(--init_from={weights}\\)"):
        train_gpt2.main(args[:-3] + [f"--init_from={other}", "--max_steps=8", f"--log_dir={log}"])
    assert {p: open(p, "rb").read() for p in glob.glob(os.path.join(log, "*"))} == before
    assert train_gpt2.main(TINY + [f"--data_root={text}", "--max_steps=7", f"--log_dir={log}"]) == 0
    assert max(losses(log)) == 7 and records(log)[-1]["step"] == 7
    assert final_weights(log)["config"]["init_from"] == weights  # the origin, kept


@pytest.mark.slow
def test_compile_is_not_used_on_an_apple_gpu(tmp_path, monkeypatch, text):
    """An Apple GPU (mps, faked here: the decision is logic) runs eager with compile=True, said in a NOTE
    that names mps, not the probe's advice to install a compiler; the probe is not run."""
    from gptlib import runtime
    monkeypatch.setattr(runtime, "compile_blocker", lambda rt: pytest.fail("the probe ran"))
    s, _, origin = decide(tmp_path, {"compile": True, "data_root": text}, runtime.Runtime(kind="mps", device="mps"))
    notes = origin["notes"]
    assert s.compile is False and origin["source"]["compile"] == "this machine"
    assert "compile=True: torch.compile is not used on Apple GPUs (mps); running eager" in notes
    assert not any("C++ compiler" in note for note in notes)


@pytest.mark.slow
def test_a_fine_tune_runs_and_records_its_weights_shape(tmp_path, capsys, text, reference):
    """--init_from=<weights> without shape settings: the run is the weights' model, and its config line and
    start record say so (not the CPU fallback's 4 layers x 64); the CPU NOTE promises no small model. A shape
    setting that differs from the weights, a recipe that would set model options, or a T beyond their
    positions, is refused in one line before anything is built."""
    from model import GPT, GPTConfig
    *_, weights = checkpoints(reference[2])  # 2 layers x 32 wide, 1024 positions
    args = ["--device=cpu", f"--data_root={text}", f"--init_from={weights}", "--max_steps=1", "--hellaswag=0",
            "--B=4", "--T=32", "--total_batch_size=128", "--val_tokens=256"]
    assert train_gpt2.main(args + [f"--log_dir={tmp_path / 'ft'}"]) == 0
    out = capsys.readouterr().out
    start = records(tmp_path / "ft")[0]
    assert start["config"]["n_layer"] == start["model_config"]["n_layer"] == 2
    assert start["config"]["n_embd"] == start["model_config"]["n_embd"] == 32
    assert '"n_layer": 2' in out and "laptop (no CUDA device: training on the CPU)" in out
    assert "n_layer=4" not in out  # the CPU's small model is not the weights'
    with pytest.raises(UserError, match=f"n_layer=3 \\(this command\\), but {weights} has n_layer=2: "
                                        "the weights decide"):
        train_gpt2.main(args + ["--n_layer=3", f"--log_dir={tmp_path / 'x'}"])
    with pytest.raises(UserError, match="--recipe=modern sets model options the weights decide"):
        train_gpt2.main(args + ["--recipe=modern", f"--log_dir={tmp_path / 'x'}"])
    torch.manual_seed(0)
    from gptlib import hf_gpt2
    hf_gpt2.save_pretrained(GPT(GPTConfig(block_size=64, vocab_size=50257, n_layer=1, n_head=2, n_embd=16)),
                            tmp_path / "hf")
    with pytest.raises(UserError, match=f"T=128, but {tmp_path / 'hf'} has 64 positions \\(block_size\\): "
                                        "use --T=64 or less"):
        train_gpt2.main(args[:-3] + ["--T=128", "--total_batch_size=512", f"--init_from={tmp_path / 'hf'}",
                                     f"--log_dir={tmp_path / 'x'}"])
    assert not os.path.exists(tmp_path / "x")


@pytest.mark.slow
def test_extending_a_finished_run_says_where_the_learning_rate_goes(tmp_path, capsys, text, reference):
    """max_steps 8 -> 12 on a finished run: the cosine is stretched, so the learning rate jumps back up; a
    NOTE says from what to what (before, only "max_steps changed")."""
    log = tmp_path / "log"
    shutil.copytree(reference[2], log)
    assert train_gpt2.main(run_args(text) + [f"--log_dir={log}", "--max_steps=12", "--eval_interval=12"]) == 0
    s = dataclasses.replace(train_gpt2.Settings(), max_lr=3e-3, warmup_steps=2)  # run_args' schedule
    was = get_lr(8, 3e-3, dataclasses.replace(s, max_steps=8))
    now = get_lr(8, 3e-3, dataclasses.replace(s, max_steps=12))
    assert (f"NOTE: the learning rate of step 9 is {now:.2e} on the new schedule, {was:.2e} on the run's "
            f"(max_steps 8 -> 12): it jumps up, then decays to the new end") in capsys.readouterr().out
    assert max(losses(log)) == 12


def test_a_batch_that_b_does_not_divide_lowers_b_with_a_note(tmp_path, text):
    """total_batch_size that the settings block's B does not divide: B is lowered to the largest that does,
    with a NOTE naming both (before, an error named a B the user never set)."""
    from gptlib.runtime import Runtime
    s, _, origin = decide(tmp_path, {"data_root": text, "total_batch_size": 96 * 1024}, Runtime(kind="cuda"))
    assert s.B == 48 and origin["notes"][0] == ("B=48: B=64 does not divide total_batch_size=98,304 into whole "
                                                "micro-steps of 1024 tokens x 1 process (set --B to choose)")
    assert origin["source"]["B"] == "a fit to 1 process"
    # on a CPU too, where the laptop's preset set B (0bcff65 said nothing there)
    s, _, origin = decide(tmp_path, {"data_root": text, "total_batch_size": 1152}, Runtime())
    assert s.B == 9 and origin["notes"][1].startswith("B=9: B=16 does not divide total_batch_size=1,152")


def test_a_fresh_start_sets_the_dead_attempts_log_aside_and_removes_its_partial_write(tmp_path, capsys, text):
    """An attempt that died before its first checkpoint (kill -9, a divergence) left a log and, killed while
    writing, a model_*.pt.tmp: the next run has nothing to continue, so it starts its log afresh (the old one
    kept as metrics.1.jsonl, not appended to: one start record, no duplicated steps) and removes the
    temporary."""
    import json
    old = [{"event": "start", "step": 0, "config": {}}] + [{"step": i, "loss": 9.0} for i in (1, 2, 3)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in old))
    (tmp_path / "model_000004.pt.tmp").write_bytes(b"half a checkpoint")
    assert train_gpt2.main(TINY + [f"--data_root={text}", "--max_steps=2", f"--log_dir={tmp_path}"]) == 0
    said = capsys.readouterr().out
    assert "NOTE: removed model_000004.pt.tmp, a checkpoint an earlier attempt did not finish writing" in said
    assert "this run starts afresh; the earlier log is kept as metrics.1.jsonl" in said
    assert not (tmp_path / "model_000004.pt.tmp").exists()
    assert [r.get("event") for r in records(str(tmp_path))].count("start") == 1
    assert loss_steps(str(tmp_path)) == [1, 2]
    assert (tmp_path / "metrics.1.jsonl").read_text().count("\n") == 4  # kept as it was


def test_a_short_run_and_a_tiny_corpus_say_each_thing_once(tmp_path, capsys, text):
    """max_steps below warmup_steps: one NOTE (db9da80 said it twice, in two wordings). A corpus whose
    validation split holds no row: one line, without the NOTE about evaluating on its rows before it."""
    assert train_gpt2.main(TINY + ["--max_steps=1", f"--data_root={text}", f"--log_dir={tmp_path}/a"]) == 0
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("NOTE")]
    assert sum(line.startswith("NOTE: warmup_steps") for line in notes) == 1, notes
    small = tmp_path / "small.txt"
    small.write_text("To be, or not to be. " * 40)
    with pytest.raises(UserError, match=r"^the validation split of .*small.txt holds no row of T\+1 = 65 "
                                        "tokens: lower T, or give it more text$"):
        train_gpt2.main(TINY + [f"--data_root={small}", "--T=64", "--max_steps=1", f"--log_dir={tmp_path}/b"])
    assert "evaluating on those" not in capsys.readouterr().out
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.raises(UserError, match=r"^data_root .*empty.txt holds no text: give a file with text in it"):
        train_gpt2.main(TINY + [f"--data_root={empty}", f"--log_dir={tmp_path}/c"])
    assert "rows of" not in capsys.readouterr().out  # no NOTE of "-1 rows" before it


@pytest.mark.slow
def test_a_resume_notes_only_what_changed(tmp_path, capsys, text):
    """What start-up lowers to fit (the CPU fallback's val_tokens, untouched, to the validation split) is
    lowered again on the resume, not a change, nor a setting kept; ./x is x; a run whose warm-up outlasts it
    says so."""
    args = [a for a in TINY if not a.startswith("--val_tokens")] + ["--checkpoint_interval=2",
                                                                     f"--log_dir={tmp_path}"]
    assert train_gpt2.main(args + ["--max_steps=2", f"--data_root={text}"]) == 0
    said = capsys.readouterr().out
    assert "NOTE: val_tokens=32,768 but the validation split holds" in said
    assert "NOTE: warmup_steps=2 >= max_steps=2: the learning rate climbs for the whole run, to max_lr=0.003 " \
           "at most, and never decays (lower --warmup_steps)" in said
    dotted = os.path.join(os.path.dirname(text), ".", os.path.basename(text))
    assert train_gpt2.main(args + ["--max_steps=4", f"--data_root={dotted}"]) == 0
    said = capsys.readouterr().out
    assert "resuming from" in said and "NOTE: changed since the checkpoint: max_steps 2 -> 4 (this command)\n" in said
    assert not any("val_tokens" in line for line in said.splitlines() if line.startswith(("NOTE: changed",
                                                                                            "NOTE: kept")))
    assert "data_root" not in said.split("config (")[0]
    assert "NOTE: warmup_steps" not in said
    assert sorted(losses(str(tmp_path))) == [1, 2, 3, 4]


@pytest.mark.slow
def test_extending_a_fine_tune_keeps_what_its_command_named(tmp_path, monkeypatch, capsys, text, reference):
    """A resume runs the settings the run saved: a fine-tune started with its data, a tiny shape, --max_lr,
    --B, --compile=False, --hellaswag_data and --tracker, extended with --max_steps alone from another folder
    (no edu_fineweb10B/ there, and a play.txt of other text), keeps every one (read from its records and its
    checkpoint), its files the first folder's; naming --max_lr then changes it, in one NOTE."""
    *_, weights = checkpoints(reference[2])
    first, other = tmp_path / "first", tmp_path / "other"
    for folder in (first, other):
        folder.mkdir()
    shutil.copy(text, first / "play.txt")
    (other / "play.txt").write_text("Another text altogether. " * 2000)
    (first / "hs.jsonl").write_text('{"ctx": "a", "endings": ["b", "c", "d", "e"], "label": 0}\n')
    monkeypatch.chdir(first)
    log = str(tmp_path / "ft")
    typed = {"data_root": "play.txt", "init_from": weights, "n_layer": 2, "n_embd": 32, "T": 32, "B": 2,
             "total_batch_size": 128, "max_lr": 1e-3, "compile": False, "hellaswag_data": "hs.jsonl",
             "tracker": "tensorboard", "val_tokens": 256, "hellaswag": 0}
    assert train_gpt2.main([f"--{k}={v}" for k, v in typed.items()] + ["--max_steps=2", f"--log_dir={log}"]) == 0
    ran = {**typed, "data_root": str(first / "play.txt"), "hellaswag_data": str(first / "hs.jsonl")}
    capsys.readouterr()
    monkeypatch.chdir(other)  # the paths typed were relative to the first folder
    assert train_gpt2.main(["--max_steps=4", f"--log_dir={log}"]) == 0
    said = capsys.readouterr().out
    starts = [r for r in records(log) if r.get("event") == "start"]
    assert len(starts) == 2 and {k: starts[0]["config"][k] for k in ran} == ran
    assert {k: starts[1]["config"][k] for k in ran} == ran and starts[1]["config"]["max_steps"] == 4
    assert {k: final_weights(log)["config"][k] for k in ran} == ran
    assert os.listdir(os.path.join(log, "tensorboard"))  # the tracker ran in both
    assert "NOTE: changed since the checkpoint: max_steps 2 -> 4 (this command)\n" in said
    assert sum(line.startswith("NOTE: changed since") for line in said.splitlines()) == 1
    assert sorted(losses(log)) == [1, 2, 3, 4]
    assert train_gpt2.main(["--max_steps=6", "--max_lr=2e-3", f"--log_dir={log}"]) == 0
    said = capsys.readouterr().out
    assert ("NOTE: changed since the checkpoint: max_lr 0.001 -> 0.002 (this command), max_steps 4 -> 6 (this "
            "command)\n") in said
    assert [r for r in records(log) if r.get("event") == "start"][-1]["config"]["max_lr"] == 2e-3
    assert train_gpt2.main(["--init_from=resume", f"--log_dir={log}"]) == 0  # its weights' shape, not the block's
    assert "already finished at step 6" in capsys.readouterr().out


def edited_script(folder, **edits):
    """A copy of train_gpt2.py in folder with its settings block edited (NAME = value, as a user does),
    loaded as a module: its main() and Settings are the copy's."""
    import importlib.util
    import re
    with open(SCRIPT, encoding="utf-8") as f:
        source = f.read()
    for name, value in edits.items():
        source, n = re.subn(rf"^{name} = [^#\n]*?(  #.*)?$", rf"{name} = {value!r}\1", source, count=1,
                            flags=re.M)
        assert n == 1, name
    path = folder / "train_gpt2.py"
    path.write_text(source, encoding="utf-8")
    spec = importlib.util.spec_from_file_location("edited_train_gpt2", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_what_the_settings_block_says_is_what_runs(tmp_path, monkeypatch, capsys):
    """A copy of train_gpt2.py with seed, min_lr_ratio and n_layer edited in its settings block, on a CPU
    without shards: the block's seed and min_lr_ratio run; the laptop's preset, which comes after the block,
    sets n_layer (its one NOTE names it); the command line comes last. Resumed from another folder (one with
    an edu_fineweb10B/ of its own), and under torchrun from one without: the run's saved settings. The block
    edited again before a resume: a line a resume may change is applied and said, the model's is refused."""
    from gptlib.checkpoint import read_newest
    from gptlib.runtime import Runtime
    monkeypatch.chdir(tmp_path)  # no edu_fineweb10B/ here
    (tmp_path / "a").mkdir()
    edited = edited_script(tmp_path / "a", n_layer=1, seed=7, min_lr_ratio=0.2)
    log = str(tmp_path / "log")
    # (a few validation rows, not the laptop's whole split: each of the 4 evaluations below took 8 s)
    assert edited.main([f"--log_dir={log}", "--max_steps=2", "--eval_interval=1", "--val_tokens=2048"]) == 0
    start = records(log)[0]
    assert {k: start["config"][k] for k in ("seed", "min_lr_ratio", "n_layer", "max_steps", "n_embd",
                                            "val_tokens")} == {
        "seed": 7, "min_lr_ratio": 0.2, "n_layer": 4, "max_steps": 2, "n_embd": 64, "val_tokens": 2048}
    assert start["source"]["n_layer"] == "the laptop preset" and "seed" not in start["source"]
    assert "n_layer=4" in start["notes"][0] and start["config"]["data_root"] == settings.SHAKESPEARE
    assert [r["step"] for r in records(log) if "val_loss" in r] == [1, 2]
    # resumed from another folder (one with an edu_fineweb10B/ of its own), and under torchrun from one
    # without: the run's own settings, its input.txt among them
    (tmp_path / "elsewhere" / "edu_fineweb10B").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert edited.main([f"--log_dir={log}", "--max_steps=3"]) == 0
    resumed = [r for r in records(log) if r.get("event") == "start"][-1]["config"]
    assert {k: resumed[k] for k in start["config"] if k != "max_steps"} == {
        k: v for k, v in start["config"].items() if k != "max_steps"}
    monkeypatch.chdir(tmp_path)
    meta = read_newest(log, Runtime()).meta
    cfg, _, _ = settings.continued(edited.CONFIG, meta, {"max_steps": 4}, log)
    settings.validate(cfg, Runtime(distributed=True, world_size=2))  # no "no shards" refusal
    assert {k: cfg[k] for k in ("data_root", "total_batch_size", "T", "n_embd")} == {
        k: start["config"][k] for k in ("data_root", "total_batch_size", "T", "n_embd")}
    (tmp_path / "b").mkdir()
    again = edited_script(tmp_path / "b", n_layer=1, seed=7, min_lr_ratio=0.3)
    assert again.main([f"--log_dir={log}", "--max_steps=4"]) == 0
    assert "changed since the checkpoint: min_lr_ratio 0.2 -> 0.3 (the settings block), max_steps 3 -> 4 (this " \
           "command)" in capsys.readouterr().out
    (tmp_path / "c").mkdir()
    again = edited_script(tmp_path / "c", n_layer=2, seed=7, min_lr_ratio=0.3)
    with pytest.raises(UserError, match=r"^the run in .*log has n_layer=4 \(now 2, the settings block\), "
                                        r"which a resume cannot change: restore it \(--n_layer=4\)"):
        again.main([f"--log_dir={log}"])


@pytest.mark.slow
def test_a_resume_refuses_before_it_fits_and_knows_a_relative_origin(tmp_path, monkeypatch, capsys, text,
                                                                     reference):
    """A T the run cannot take is refused as such, before the validation split's fit would say val_tokens
    is too small for it; a fine-tune whose checkpoint (written before paths were kept absolute) holds its
    origin relative continues under the same command, typed again from the same folder."""
    log = tmp_path / "log"
    shutil.copytree(reference[2], log)
    with pytest.raises(UserError, match=r"^the run in .*log has T=32 \(now 512, this command\), "
                                        r"total_batch_size=512 \(now 2048, this command\), which a resume"):
        train_gpt2.main([f"--log_dir={log}", "--T=512", "--total_batch_size=2048"])
    for flag in ("--T=256", "--total_batch_size=64"):  # before the checks of the run's own --B=4, which fail
        with pytest.raises(UserError, match=rf"^the run in .*log has {flag[2:].split('=')[0]}=.* which a resume"):
            train_gpt2.main([f"--log_dir={log}", flag])
    *_, weights = checkpoints(reference[2])
    shutil.copy(weights, tmp_path / "w.pt")
    monkeypatch.chdir(tmp_path)
    args = TINY + [f"--data_root={text}", "--init_from=w.pt", "--max_steps=1", "--log_dir=ft"]
    assert train_gpt2.main(args) == 0
    path = checkpoints("ft")[-1]  # as an older version wrote it: the origin as typed, no flags
    ckpt = {k: v for k, v in torch.load(path, weights_only=True).items() if k not in ("checksum", "flags")}
    assert ckpt["config"]["init_from"] == str(tmp_path / "w.pt")
    checkpoint.save_checkpoint({**ckpt, "config": {**ckpt["config"], "init_from": "w.pt"}}, path)
    capsys.readouterr()
    assert train_gpt2.main(args[:-2] + ["--max_steps=2", "--log_dir=ft"]) == 0
    assert "resuming from ft/model_000001.pt" in capsys.readouterr().out and max(losses("ft")) == 2


def test_rank_without_local_rank(monkeypatch):
    """Kubeflow's PyTorchJob sets RANK and WORLD_SIZE, not LOCAL_RANK (one process a pod): the process is its
    node's first; RANK without WORLD_SIZE is one line."""
    import socket
    import torch.distributed as dist
    from gptlib import runtime
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    for k, v in {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    rt = runtime.setup("cpu")
    try:
        assert (rt.rank, rt.local_rank, rt.world_size, rt.distributed) == (0, 0, 1, True)
    finally:
        dist.destroy_process_group()
    monkeypatch.delenv("WORLD_SIZE")
    with pytest.raises(UserError, match="RANK is set but WORLD_SIZE is not: launch with torchrun"):
        runtime.setup("cpu")


@pytest.mark.slow
def test_the_log_dir_lock_works_without_flock(tmp_path, monkeypatch):
    """Some network filesystems have no flock (ENOSYS): filelock 3.x then raised NotImplementedError out of
    the log_dir lock; 4.x falls back to a lock file that records its owner (from 4.1 on one that excludes:
    with 4.0.12 the second holder below gets it too), and requirements.txt asks for it.
    A second holder is still refused."""
    import errno
    import fcntl
    from gptlib import runlog
    import re

    def no_flock(fd, operation):
        raise OSError(errno.ENOSYS, "Function not implemented")
    monkeypatch.setattr(fcntl, "flock", no_flock)
    with pytest.warns(UserWarning, match="flock not supported on this filesystem, falling back"):
        assert runlog.lock(str(tmp_path / "log"), create=True) is None
    with open(os.path.join(ROOT, "requirements.txt")) as f:
        assert re.search(r"^filelock>=4\.1", f.read(), re.M)  # 4.0.x: the second holder gets it too
    other = subprocess.run([sys.executable, "-c", "import errno, fcntl, sys\nfrom gptlib import runlog\n"
                            "def no_flock(fd, op): raise OSError(errno.ENOSYS, 'no flock')\n"
                            "fcntl.flock = no_flock\n"
                            f"print(runlog.lock({str(tmp_path / 'log')!r}, create=True))"],
                           cwd=ROOT, capture_output=True, text=True)
    assert "is in use by another run (pid" in other.stdout, other.stdout + other.stderr


def test_ddp_reduces_gradients_in_the_last_micro_step_only():
    """wrap_model under torchrun (one gloo rank, in-process): train_step runs the micro-steps before the
    last in DDP's no_sync, so the gradients cross ranks in the last micro-step's backward only, not once a
    micro-step (nor in the first); the update is the one-process run's."""
    import socket
    import torch.distributed as dist
    from gptlib.runtime import Runtime
    from model import GPT, GPTConfig
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    s = dataclasses.replace(train_gpt2.Settings(), compile=False)
    config = GPTConfig(block_size=16, vocab_size=64, n_layer=1, n_head=2, n_embd=16)
    torch.manual_seed(0)
    batches = [(torch.randint(64, (2, 16)), torch.randint(64, (2, 16))) for _ in range(3)]
    grads = []
    dynamo = torch._dynamo.config  # ddp() lets Dynamo trace DDP's profiler record: restored after the test
    kept = {k: getattr(dynamo, k) for k in ("capture_profiler_record_function",) if hasattr(dynamo, k)}
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        for rt in (Runtime(), Runtime(distributed=True)):
            torch.manual_seed(0)
            with dynamo.patch(kept):
                models = train_gpt2.wrap_model(GPT(config), s, rt)
            reduced, forwards = [], []
            models.raw.register_forward_pre_hook(lambda module, args: forwards.append(1))
            if rt.distributed:  # DDP's all-reduce of a bucket: the micro-steps run by then
                def hook(state, bucket):
                    reduced.append(len(forwards))
                    return dist.all_reduce(bucket.buffer(), async_op=True).get_future().then(
                        lambda fut: fut.value()[0])
                models.train_model.register_comm_hook(None, hook)
            opt = torch.optim.SGD(models.raw.parameters(), lr=0.0)
            scaler = torch.amp.GradScaler("cpu", enabled=False)
            train_gpt2.train_step(batches, models, [opt], scaler, rt, grad_clip=1.0)
            grads.append([p.grad.clone() for p in models.raw.parameters()])
            assert not rt.distributed or reduced and set(reduced) == {len(batches)}, reduced
    finally:
        dist.destroy_process_group()
    assert all(torch.allclose(a, b) for a, b in zip(*grads))


def test_stop_signals_where_stdout_is_a_closed_pipe(monkeypatch):
    """`python train_gpt2.py | tee log.txt`: Ctrl-C ends tee too, so saying a signal meets a closed pipe. The
    first signal still asks for a checkpoint and the second still stops the process now (os._exit, faked);
    the pipe's error does not reach the step."""
    from gptlib import runtime
    read, write = os.pipe()
    os.close(read)
    exits = []
    with open(write, "w") as closed:
        monkeypatch.setattr(sys, "stdout", closed)
        monkeypatch.setattr(runtime.os, "_exit", exits.append)
        with runtime.catch_stop_signals() as received:
            os.kill(os.getpid(), signal.SIGINT)
            assert received == [signal.SIGINT] and exits == []
            os.kill(os.getpid(), signal.SIGTERM)
            assert received == [signal.SIGINT] and exits == [128 + signal.SIGTERM]
        monkeypatch.undo()
