"""Faults a long run meets, injected: an evaluation that fails, a disk that fills or cannot be written, a peer
that hangs, a scheduler's warning before the time limit. Each ends in one line with nothing lost."""
import math
import os

import pytest
import torch

import train_gpt2
from checkpoint import checkpoints
from conftest import TINY, losses, records
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
