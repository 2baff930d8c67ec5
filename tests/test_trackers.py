"""--tracker: TensorBoard and W&B get what metrics.jsonl gets, read back with their own readers (TensorBoard's
event accumulator; `wandb leet inspect --json` on the offline run files), across a resume."""
import glob
import json
import math
import os
import subprocess
import sys

import pytest

from conftest import TINY, records
from gptlib.checkpoint import checkpoints
from gptlib.errors import UserError
import train_gpt2


def wandb_records(run_dir):
    """The records of an offline W&B run, as wandb's own inspector prints them."""
    (path,) = glob.glob(os.path.join(run_dir, "run-*.wandb"))
    r = subprocess.run([os.path.join(os.path.dirname(sys.executable), "wandb"), "leet", "inspect", "--json",
                        path], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]


@pytest.mark.slow
def test_trackers_get_what_the_log_gets_and_a_resume_continues_them(tmp_path, monkeypatch, text):
    """5 steps with both trackers; step 5's checkpoint then lost (as after a crash), and the run resumed from
    step 4 to 6. TensorBoard holds one value a step, each metrics.jsonl's (the redone step 5 the new one), the
    evaluations and the samples; W&B holds the same run (one id, kept in log_dir), its config the start
    record's settings, its history the log's values."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    log = tmp_path / "log"
    args = TINY + [f"--data_root={text}", "--eval_interval=2", "--checkpoint_interval=2",
                   "--tracker=tensorboard,wandb", f"--log_dir={log}"]
    assert train_gpt2.main(args + ["--max_steps=5"]) == 0
    os.remove(checkpoints(log)[-1])  # model_000005.pt: the resume redoes step 5
    assert train_gpt2.main(args + ["--max_steps=6"]) == 0
    steps = {r["step"]: r for r in records(log) if "loss" in r and "event" not in r}
    vals = {r["step"]: r for r in records(log) if "val_loss" in r}
    assert sorted(steps) == [1, 2, 3, 4, 5, 6] and sorted(vals) == [2, 4, 6]

    board = EventAccumulator(str(log / "tensorboard"))
    board.Reload()
    for name, source in (("loss", steps), ("lr", steps), ("val_loss", vals), ("val_bpb", vals)):
        got = [(e.step, e.value) for e in board.Scalars(("eval/" if "val" in name else "train/") + name)]
        assert [step for step, _ in got] == sorted(source), (name, got)  # one value a step
        assert all(math.isclose(value, source[step][name], rel_tol=1e-6) for step, value in got)
    assert {"eval/samples/text_summary", "config/text_summary"} <= set(board.Tags()["tensors"])
    assert {"train/loss", "train/grad_norm", "speed/tok_s", "speed/elapsed", "eval/val_loss"} <= \
        set(board.Tags()["scalars"])

    runs = sorted(glob.glob(str(log / "wandb" / "offline-run-*")))
    assert len(runs) == 2 and all(run.endswith((log / "wandb_id").read_text()) for run in runs)
    history = {}
    for run in runs:
        recs = wandb_records(run)
        (started,) = [r["run"] for r in recs if r["type"] == "run"]
        assert started["run_id"] == (log / "wandb_id").read_text()
        assert started["config"]["update"]["n_layer"] == 2 and started["config"]["update"]["tracker"] == \
            "tensorboard,wandb"
        for r in recs:
            if r["type"] == "history":
                history.setdefault(r["history"]["step"]["num"], {}).update(r["history"]["item"])
    assert sorted(history) == [1, 2, 3, 4, 5, 6]
    assert all(math.isclose(history[s]["train/loss"], steps[s]["loss"], rel_tol=1e-9) for s in steps)
    assert all(math.isclose(history[s]["eval/val_loss"], vals[s]["val_loss"], rel_tol=1e-9) for s in vals)
    last_samples = [r for r in records(log) if "samples" in r][-1]["samples"]
    assert history[6]["eval/samples"] == "\n\n".join(last_samples)


def test_tracker_mistakes_are_one_line(tmp_path, monkeypatch, text):
    with pytest.raises(UserError, match="--tracker='mlflow': use tensorboard or wandb"):
        train_gpt2.main(TINY + ["--tracker=mlflow", f"--log_dir={tmp_path / 'a'}"])
    monkeypatch.setitem(sys.modules, "wandb", None)  # not installed
    with pytest.raises(UserError, match="--tracker=wandb needs the wandb package: pip install wandb"):
        train_gpt2.main(TINY + [f"--data_root={text}", "--tracker=wandb", f"--log_dir={tmp_path / 'b'}"])
