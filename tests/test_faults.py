"""Faults a long run meets, injected: an evaluation that fails, a disk that fills or cannot be written, a peer
that hangs, a scheduler's warning before the time limit. Each ends in one line with nothing lost."""
import errno
import glob
import math
import os

import pytest
import torch

import train_gpt2
from checkpoint import checkpoints
from conftest import TINY, losses, records, run_args
from errors import UserError


def evaluations(log_dir):
    return [r["step"] for r in records(log_dir) if "val_loss" in r]


def test_an_evaluation_that_fails_loses_no_training(tmp_path, monkeypatch, capsys, text):
    """Validation at step 3 fails with a bug (no checkpoint due there): the step's checkpoint is written, then
    the traceback. The rerun evaluates step 3 first, trains on, writes step 6's checkpoint before evaluating
    it, and that evaluation runs out of memory: one line naming eval_B and the checkpoint. The rerun with a
    smaller eval_B only evaluates step 6. The losses are the uninterrupted run's, each evaluation logged
    once."""
    args = TINY + [f"--data_root={text}", "--max_steps=6", "--eval_interval=3", "--checkpoint_interval=100"]
    assert train_gpt2.main(args + [f"--log_dir={tmp_path / 'whole'}"]) == 0
    log = tmp_path / "log"
    real = train_gpt2.validation_loss
    calls = []

    def fails(error, at):  # at the at-th call
        def validation_loss(*a, **kw):
            calls.append(1)
            if len(calls) == at:
                raise error
            return real(*a, **kw)
        return validation_loss

    monkeypatch.setattr(train_gpt2, "validation_loss", fails(RuntimeError("a bug in evaluation"), 1))
    with pytest.raises(RuntimeError, match="a bug in evaluation"):
        train_gpt2.main(args + [f"--log_dir={log}"])
    said = "error: evaluating step 3 failed (the traceback follows); the step is in model_000003.pt (step 3)"
    assert said in capsys.readouterr().out
    assert [os.path.basename(p) for p in checkpoints(log)] == ["model_000003.pt"]

    calls.clear()
    # step 3's evaluation, done first, succeeds; step 6's fails
    monkeypatch.setattr(train_gpt2, "validation_loss", fails(torch.OutOfMemoryError("CUDA out of memory"), 2))
    with pytest.raises(UserError) as e:
        train_gpt2.main(args + [f"--log_dir={log}"])
    assert "evaluating that step first: its evaluation is not in the log" in capsys.readouterr().out
    assert str(e.value) == ("out of memory evaluating step 6 at eval_B=4: the step is in model_000006.pt "
                            "(step 6); lower --eval_B (or --hellaswag) and rerun the same command, which "
                            "evaluates step 6 first")
    assert os.path.basename(checkpoints(log)[-1]) == "model_000006.pt"  # written before the evaluation

    monkeypatch.setattr(train_gpt2, "validation_loss", real)
    assert train_gpt2.main(args + [f"--log_dir={log}", "--eval_B=2"]) == 0
    assert losses(log) == losses(tmp_path / "whole")
    assert evaluations(log) == evaluations(tmp_path / "whole") == [3, 6]
    vals = ([r["val_loss"] for r in records(d) if "val_loss" in r] for d in (log, tmp_path / "whole"))
    for got, want in zip(*vals):
        assert math.isclose(got, want, rel_tol=1e-6)  # eval_B=2 reads the same tokens
    assert train_gpt2.main(args + [f"--log_dir={log}"]) == 0  # finished and evaluated: nothing to do
    assert "already finished at step 6" in capsys.readouterr().out


def full_disk(after):
    """A torch.save that, from its `after`-th call on, fails as torch's writer does on a full disk: a
    RuntimeError ("unexpected pos") raised while handling the OSError, after part of the file is written."""
    real, calls = torch.save, []

    def save(obj, f):
        calls.append(1)
        if len(calls) < after:
            return real(obj, f)
        f.write(b"\0" * 4096)
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")
    return save


def test_a_full_disk_while_checkpointing_is_one_line(tmp_path, monkeypatch, text, reference):
    """The disk fills while step 6's checkpoint is written: one line naming the file, the error and the room
    it needs; no .tmp left, step 4's checkpoint intact. The same command, once there is room, resumes from
    step 4 and ends as the uninterrupted run."""
    import checkpoint
    ref_losses, _, _ = reference
    log = tmp_path / "log"
    monkeypatch.setattr(checkpoint.torch, "save", full_disk(after=3))  # steps 2 and 4 are written
    with pytest.raises(UserError) as e:
        train_gpt2.main(run_args(text) + [f"--log_dir={log}"])
    assert str(e.value).startswith(f"could not write checkpoint {log / 'model_000006.pt'} (No space left on "
                                   "device; it needs ")
    assert str(e.value).endswith("the earlier checkpoints are untouched: make room there (or make it "
                                 "writable) and rerun the same command, which resumes from the newest one")
    assert sorted(os.path.basename(p) for p in glob.glob(str(log / "model_*"))) == ["model_000002.pt",
                                                                                     "model_000004.pt"]
    checkpoint.load_checkpoint(str(log / "model_000004.pt"))  # whole: it verifies
    monkeypatch.undo()
    assert train_gpt2.main(run_args(text) + [f"--log_dir={log}"]) == 0
    assert losses(log) == ref_losses


def test_a_log_that_cannot_be_appended_to_is_one_line(tmp_path, monkeypatch, text):
    """metrics.jsonl cannot be appended to from step 3 on (the disk filled): one line naming it; the
    checkpoint of step 2 resumes."""
    real, writes = open, []

    def fails(path, mode="r", *args, **kwargs):
        if str(path).endswith("metrics.jsonl") and mode == "a":
            writes.append(1)
            if len(writes) > 3:  # the start record, steps 1 and 2
                raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, mode, *args, **kwargs)
    monkeypatch.setattr(train_gpt2, "open", fails, raising=False)
    args = TINY + [f"--data_root={text}", "--max_steps=4", "--checkpoint_interval=2", "--eval_interval=100",
                   f"--log_dir={tmp_path}"]
    with pytest.raises(UserError, match=f"^could not append to {tmp_path / 'metrics.jsonl'} \\(No space left "
                                        "on device\\): make room there .*resumes from the newest "
                                        "checkpoint$"):
        train_gpt2.main(args)
    monkeypatch.undo()
    assert train_gpt2.main(args) == 0 and sorted(losses(tmp_path)) == [1, 2, 3, 4]


@pytest.mark.parametrize("where", ["existing", "new"])
def test_a_log_dir_that_cannot_be_written_is_one_line_before_anything_is_built(tmp_path, monkeypatch, where):
    """A read-only mount or no permission (faked: the tests run as root, whom permissions do not stop)."""
    import checkpoint
    import model
    monkeypatch.setattr(model.GPT, "__init__", lambda *a: pytest.fail("a model was built"))
    if where == "existing":
        def read_only(*args, **kwargs):
            raise OSError(errno.EROFS, "Read-only file system")
        monkeypatch.setattr(checkpoint.os, "makedirs", read_only)
        log, said = tmp_path, f"--log_dir={tmp_path} cannot be written (Read-only file system)"
    else:
        monkeypatch.setattr(checkpoint.os, "access", lambda path, mode: False)
        log = tmp_path / "a" / "log"
        said = f"--log_dir={log} cannot be created: {tmp_path} is not writable"
    with pytest.raises(UserError) as e:
        train_gpt2.main(TINY + [f"--log_dir={log}"])
    assert str(e.value).startswith(said)
    assert str(e.value).endswith("make it writable or choose another --log_dir")
