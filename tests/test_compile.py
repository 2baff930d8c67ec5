"""torch.compile through train_gpt2.py: compiled DDP (with Muon) and FSDP runs on 2 gloo ranks against the
eager one-process run, with compiled evaluations that compile nothing new after the first; and the probe that
finds out before training that compile cannot work here."""
import math
import subprocess
import sys

import pytest

from checkpoint import checkpoints
from conftest import ENV, MUON, SCRIPT, TINY, hellaswag_example, losses, records, run_args, train, write_jsonl


@pytest.mark.parametrize("wrap", ["ddp", "fsdp"])
def test_compiled_ranks_match_the_eager_one_process_run(tmp_path, text, reference, muon_reference, wrap):
    """torch.compile on 2 gloo ranks x 2 micro-steps, with DDP inside it (here with Muon: DDP all-reduces the
    gradients Muon orthogonalizes) or on the FSDP-sharded model (AdamW): the eager one-process run's losses to
    rounding (compiled kernels round differently; Newton-Schulz runs in bf16). The compiled HellaSwag (7
    examples: the ranks get 4 and 3) equals an eager one-process evaluation, samples are drawn, and the
    training steps and evaluation after the first evaluation compile nothing new (bench.py --gpu-check checks
    this on a GPU)."""
    from checkpoint import load_model
    from gpu_check import recompiles
    from hellaswag import evaluate, load_examples
    data = write_jsonl(tmp_path / "hs.jsonl", [hellaswag_example(i) for i in range(7)])
    log = tmp_path / "compiled"
    extra = MUON if wrap == "ddp" else ["--fsdp=True"]
    r = train(run_args(text) + extra + ["--compile=True", "--hellaswag=7", f"--hellaswag_data={data}",
                                        f"--log_dir={log}"], cwd=tmp_path, nproc=2,
              env={"TORCH_LOGS": "recompiles", "PYTHONUNBUFFERED": "1"})
    before, after = recompiles(r.stdout, "step 4: hellaswag")
    assert before >= 1 and after == 0, r.stdout[-5000:]  # evaluation recompiles (no grad), once
    recs = records(log)
    hs = [rec for rec in recs if "hellaswag" in rec]
    assert [h["step"] for h in hs] == [4, 8] and hs[-1]["hellaswag_n"] == 7
    assert any("samples" in rec for rec in recs) and "sample: " in r.stdout
    ref, got = losses(muon_reference if wrap == "ddp" else reference[2]), losses(log)
    assert sorted(got) == sorted(ref) == list(range(1, 9))
    for s in ref:
        assert math.isclose(got[s], ref[s], rel_tol=1e-4 if wrap == "ddp" else 1e-5), (s, got[s], ref[s])
    eager = evaluate(load_model(checkpoints(log)[-1]).eval(), load_examples(data), "cpu", batch_size=1)
    assert eager["acc_norm"] == hs[-1]["hellaswag"] and eager["acc"] == hs[-1]["hellaswag_acc"]


def test_bf16_on_cpu_and_compile_that_cannot_work(tmp_path, text):
    """--dtype=bf16 runs on the CPU too. compile=True where inductor cannot work (here: no C++ compiler) is
    found out by a probe before training: one NOTE, then the run goes on eager; the log says compile false."""
    env = {**ENV, "CXX": "/nonexistent/g++"}
    r = subprocess.run([sys.executable, SCRIPT] + TINY + [f"--data_root={text}", "--max_steps=2",
                                                          "--eval_interval=2",
                        "--dtype=bf16", "--compile=True", f"--log_dir={tmp_path / 'log'}"],
                       cwd=tmp_path, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "NOTE: compile=True but torch.compile does not work here (" in r.stdout
    assert "running eager" in r.stdout
    start = records(tmp_path / "log")[0]
    assert start["config"]["compile"] is False and start["config"]["dtype"] == "bf16"
    assert sorted(losses(tmp_path / "log")) == [1, 2]


# One training step (forward + backward under bf16 autocast) of a 3-block model, wrapped by train_gpt2's own
# wrap_model for DDP and FSDP with activation checkpointing off and on, profiled on every rank.
