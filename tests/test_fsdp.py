"""FSDP2 (--fsdp=True) against DDP, on 2 gloo processes, and elastic restarts under torchrun.

Under sharding every forward is collective: a rank that skips one (an uneven HellaSwag split, sampling on rank
0 only) hangs the others. Every run here has a timeout, so a hang fails the test instead of the suite.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import zipfile

import pytest
import torch

from conftest import (ENV, ROOT, SCRIPT, TINY, final_weights, hellaswag_example, loss_steps, losses, records,
                      run_args, write_jsonl)
from gptlib.checkpoint import checkpoints, nbytes

pytestmark = pytest.mark.slow  # every test here starts processes or compiles

TIMEOUT = 300  # seconds; these runs take ~15 s, a hang would take forever


def torchrun(args, cwd, extra=(), env=None, check=True):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", *extra,
           SCRIPT]
    r = subprocess.run(cmd + args, cwd=cwd, env=env or ENV, capture_output=True, text=True, timeout=TIMEOUT)
    if check:
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r


def args(text, data, log_dir):
    # run_args on 2 ranks x 2 micro-steps, validating the same rows as one process (val_tokens); 5 HellaSwag
    # examples: 3 on rank 0, 2 on rank 1, so rank 1 pads a batch
    return run_args(text) + ["--hellaswag=5", f"--hellaswag_data={data}", f"--log_dir={log_dir}"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, text):
    """The same 8 steps under DDP and under FSDP (2 gloo ranks each)."""
    d = tmp_path_factory.mktemp("fsdp")
    data = write_jsonl(d / "hs.jsonl", [hellaswag_example(i) for i in range(5)])
    out = {}
    for name, extra in (("ddp", []), ("fsdp", ["--fsdp=True"])):
        out[name] = torchrun(args(text, data, d / name) + extra, cwd=d)
    return d, data, out


def compare(log_a, log_b, steps=range(1, 9)):
    """Per-step losses within float rounding (the clip norm is summed in another order under FSDP) and final
    weights tensor by tensor in relative norm (see test_train's DDP test)."""
    a, b = losses(log_a), losses(log_b)
    assert sorted(a) == sorted(b) == list(steps)
    for s in a:
        assert abs(a[s] - b[s]) <= 1e-5 * abs(a[s]), (s, a[s], b[s])
    wa, wb = final_weights(log_a)["model"], final_weights(log_b)["model"]
    assert wa.keys() == wb.keys()
    for k in wa:
        assert (wa[k] - wb[k]).norm() <= 1e-3 * wa[k].norm(), k


def test_ddp_matches_one_process(runs, reference):
    """2 gloo ranks x 2 micro-steps vs 1 process x 4 micro-steps: the same data, updates and validation
    rows."""
    d, _, out = runs
    ref_losses, ref_weights, ref_log = reference
    start = records(d / "ddp")[0]
    assert (start["config"]["B"], start["config"]["total_batch_size"], start["world_size"]) == (4, 512, 2)
    got = losses(d / "ddp")
    assert sorted(got) == sorted(ref_losses) == list(range(1, 9))
    for s in got:
        assert abs(got[s] - ref_losses[s]) <= 1e-5 * ref_losses[s], (s, got[s], ref_losses[s])
    vals = [[r["val_loss"] for r in records(log) if "val_loss" in r] for log in (ref_log, d / "ddp")]
    assert len(vals[0]) == 2 and all(abs(a - b) <= 1e-5 * a for a, b in zip(*vals))
    # Adam turns rounding-level gradient differences on near-zero elements into steps of ~lr, so weights are
    # compared tensor by tensor in relative norm
    ckpt = final_weights(d / "ddp")
    for k in ref_weights:
        assert (ckpt["model"][k] - ref_weights[k]).norm() <= 1e-3 * ref_weights[k].norm(), k
    assert ckpt["world_size"] == 2


def test_fsdp_matches_ddp(runs):
    d, _, out = runs
    assert records(d / "fsdp")[0]["config"]["fsdp"] is True
    compare(d / "ddp", d / "fsdp")
    evals = {name: [{k: v for k, v in r.items() if k not in ("val_loss",)} for r in records(d / name)
                    if "hellaswag" in r or "samples" in r] for name in out}
    # HellaSwag counts and sampled text, twice
    assert evals["ddp"] == evals["fsdp"] and len(evals["ddp"]) == 4
    hs = [r for r in evals["fsdp"] if "hellaswag" in r]
    assert [r["hellaswag_n"] for r in hs] == [5, 5]  # the padding batch was not counted
    assert out["fsdp"].stdout.count("sample: ") == 8  # 4 samples, 2 evals, printed by rank 0 only
    vals = {name: [r["val_loss"] for r in records(d / name) if "val_loss" in r] for name in out}
    assert all(abs(a - b) <= 1e-5 * a for a, b in zip(vals["ddp"], vals["fsdp"]))
    # the same file as DDP writes: full tensors, wte and lm_head stored once, optimizer state by name
    a, b = final_weights(d / "ddp"), final_weights(d / "fsdp")
    assert b["model"]["lm_head.weight"].data_ptr() == b["model"]["transformer.wte.weight"].data_ptr()
    # the tensors torch.save wrote, one record each (the files' sizes differ: their pickles hold the run's
    # flags and log_dir, and each record is padded to 64 bytes after them)
    stored = [sorted(i.file_size for i in zipfile.ZipFile(checkpoints(d / name)[-1]).infolist()
                     if re.search(r"/data/\d+$", i.filename)) for name in ("ddp", "fsdp")]
    assert stored[0] == stored[1] and sum(stored[0]) == nbytes({**a, "model": {
        k: v for k, v in a["model"].items() if k != "lm_head.weight"}})
    assert {k: (v.dtype, v.shape) for k, v in a["model"].items()} == {
        k: (v.dtype, v.shape) for k, v in b["model"].items()}
    assert a["optimizer"]["state"].keys() == b["optimizer"]["state"].keys()
    assert "transformer.wte.weight" in b["optimizer"]["state"]


def test_fsdp_checkpoint_resumes_under_ddp(runs, tmp_path, text):
    """Step 6's checkpoint of the FSDP run continues under DDP (--fsdp=False: a resume replays the run's own
    --fsdp=True) and ends where the DDP run ended. (The other
    way round is the elastic restart below: the files are the same whoever wrote them, see the test above)."""
    d, data, _ = runs
    log = tmp_path / "log"
    shutil.copytree(d / "fsdp", log)
    for path in checkpoints(log):
        if not path.endswith("model_000006.pt"):
            os.remove(path)
    r = torchrun(args(text, data, log) + ["--fsdp=False"], cwd=tmp_path)  # the run's own flag replayed: named
    assert f"resuming from {log}/model_000006.pt" in r.stdout
    assert "NOTE: changed since the checkpoint: fsdp True -> False (this command)" in r.stdout
    compare(d / "ddp", log)
    assert loss_steps(log) == list(range(1, 9))


def test_fsdp_fp16_skips_the_same_steps_as_ddp(tmp_path, text):
    """fp16 loss scaling over shards: an overflow in any rank's shard skips the step on every rank, as DDP."""
    base = TINY + [f"--data_root={text}", "--max_steps=3", "--eval_interval=3", "--checkpoint_interval=3",
                   "--T=16", "--total_batch_size=256", "--dtype=fp16", "--loss_scale=1048576"]
    for name, extra in (("ddp", []), ("fsdp", ["--fsdp=True"])):
        torchrun(base + [f"--log_dir={tmp_path / name}"] + extra, cwd=tmp_path)
    recs = {name: [r for r in records(tmp_path / name) if "loss" in r and "event" not in r]
            for name in ("ddp", "fsdp")}
    assert [r["skipped"] for r in recs["ddp"]] == [r["skipped"] for r in recs["fsdp"]]
    assert any(r["skipped"] for r in recs["ddp"]) and not all(r["skipped"] for r in recs["ddp"])
    # (weights: 2 Adam steps from zero biases amplify fp16 rounding)
    for a, b in zip(recs["ddp"], recs["fsdp"]):
        assert abs(a["loss"] - b["loss"]) <= 1e-5 * a["loss"], (a, b)
    assert final_weights(tmp_path / "fsdp")["scaler"] == final_weights(tmp_path / "ddp")["scaler"]


def test_shards_hold_the_estimate_and_one_ranks_failure_is_agreed(tmp_path):
    """One torchrun of 2 gloo ranks (tests/workers/fsdp_ranks.py) with an FSDP2 model: each rank holds half
    of the parameters and AdamW states, as accounting.py estimates. Rank 0's checkpoint write fails on a full
    disk: rank 0 raises its one line (its rank set, so it says it) and rank 1 stops at the same point
    (PeerFailed), at once, not after a lost connection or the collective timeout. Ctrl-C on rank 1 inside
    runtime.together: rank 1 raises KeyboardInterrupt, rank 0 PeerFailed, and the ranks still agree
    afterwards."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           os.path.join(ROOT, "tests", "workers", "fsdp_ranks.py"), str(tmp_path)]
    r = subprocess.run(cmd, cwd=ROOT, env={**ENV, "PYTHONPATH": ROOT},
                       capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert sorted(m["rank"] for m in ranks) == [0, 1]
    for m in ranks:  # each rank holds half: dim 0 of every tensor is split, rounded up on rank 0
        assert abs(m["params"] - m["est_params"]) <= 0.01 * m["est_params"], m
        assert abs(m["adamw"] - m["est_adamw"]) <= 0.01 * m["est_adamw"], m
    assert sum(m["params"] for m in ranks) == ranks[0]["full"]  # and together all of it, once
    zero, one = ranks
    assert zero["write"][:2] == ["UserError", 0] and one["write"][:2] == ["PeerFailed", None], (zero, one)
    assert one["write"][2] < 30, one  # the collective timeout is 60 s
    assert zero["ctrl_c"][:2] == ["PeerFailed", None] and one["ctrl_c"][:2] == ["KeyboardInterrupt", 1]
    assert zero["log"][:2] == ["UserError", 0] and one["log"][:2] == ["PeerFailed", None]  # agreed on
    assert zero["after"][0] == one["after"][0] == "none"
    assert not list(tmp_path.glob("model_*"))  # nothing half-written is left as a checkpoint


def workers(agent_pid):
    """{rank: pid} of the processes torchrun's agent started."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/status") as f:
                ppid = int(next(line for line in f if line.startswith("PPid:")).split()[1])
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
        except (OSError, StopIteration):
            continue
        if ppid == agent_pid and b"RANK" in env:
            found[int(env[b"RANK"])] = int(pid)
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds the workers through /proc")
def test_a_stopped_worker_times_out_and_torchrun_restarts_the_run(runs, tmp_path, text):
    """torchrun --max-restarts=2 with --collective_timeout=3: one of the two workers is stopped (SIGSTOP: a
    hung GPU or process) mid-run. The other waits 3 s at the next collective, then ends in one line naming the
    step, the timeout and the newest checkpoint; the agent restarts both (the stopped one is killed, as the
    agent does after its grace period), they resume from that checkpoint, and the run ends with the
    uninterrupted run's weights."""
    d, data, _ = runs
    log = tmp_path / "log"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "--max-restarts=2",
           SCRIPT] + args(text, data, log) + ["--fsdp=True", "--collective_timeout=3"]
    # docs/model.md: a stale store can hang the restart
    env = {**ENV, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    agent = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
    try:
        deadline = time.time() + TIMEOUT
        while time.time() < deadline and agent.poll() is None:
            if os.path.exists(log / "metrics.jsonl") and max(losses(log), default=0) >= 5:
                break
            time.sleep(0.02)
        victims = workers(agent.pid)
        assert set(victims) == {0, 1}, victims
        os.kill(victims[1], signal.SIGSTOP)
        stopped = time.time()
        while time.time() < deadline and workers(agent.pid).get(0) == victims[0]:  # until rank 0 gives up
            time.sleep(0.05)
        waited = time.time() - stopped
        os.kill(victims[1], signal.SIGKILL)  # the agent's SIGTERM waits for a SIGCONT, its SIGKILL 30 s
        out, _ = agent.communicate(timeout=TIMEOUT)
    finally:
        if agent.poll() is None:
            agent.kill()
    assert agent.returncode == 0, out[-3000:]
    said = [line for line in out.splitlines() if line.startswith("error: ")]
    assert len(said) == 1 and said[0].startswith("error: no answer from another process for 3 s "
                                                 "(--collective_timeout) while this one was "), out[-3000:]
    # rank 0's 3 s run from when it began to wait, which may be a moment before rank 1 stopped
    assert "The newest checkpoint is model_000004.pt (step 4)" in said[0] and 2.5 <= waited < 30, waited
    starts = [r for r in records(log) if r.get("event") == "start"]
    assert len(starts) == 2 and starts[1]["step"] in (4, 6)  # restarted once, from a checkpoint
    assert losses(log) == losses(d / "fsdp") and loss_steps(log) == list(range(1, 9))  # bit for bit
    w, ref = final_weights(log)["model"], final_weights(d / "fsdp")["model"]
    assert all(torch.equal(w[k], ref[k]) for k in ref)
