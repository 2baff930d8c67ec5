"""torch.compile through train_gpt2.py: compiled DDP (with Muon) and FSDP runs on 2 gloo ranks against the
eager one-process run, with compiled evaluations that compile nothing new after the first; and the probe that
finds out before training that compile cannot work here."""
import json
import math
import os
import subprocess
import sys

import pytest

from conftest import (ENV, MODERN_RUN, ROOT, SCRIPT, TINY, hellaswag_example, losses, records, run_args,
                      train, write_core_bundle, write_jsonl)
from gptlib.checkpoint import checkpoints

pytestmark = pytest.mark.slow  # every test here starts processes or compiles


@pytest.mark.parametrize("wrap", ["ddp", "fsdp"])
def test_compiled_ranks_match_the_eager_one_process_run(tmp_path, text, reference, modern_reference, wrap):
    """torch.compile under torchrun with DDP inside it (here --recipe=modern: rotary, QK-norm and the rest
    compiled, DDP's buckets split the graph, no_sync skips the all-reduce of 3 micro-steps in 4, and Muon
    orthogonalizes the gradients DDP reduces), or on the FSDP-sharded GPT-2 (AdamW) with activation
    checkpointing (each block recomputed in backward: Inductor's hardest case), region by region. On one
    rank: each rank compiles the same graphs (twice the minutes on 2 cores); gradient sync and sharding under
    compile across 2 ranks are test_every_part_of_the_step's, HellaSwag split 4/3 over 2 FSDP ranks
    test_fsdp's. Either gives the eager one-process run's losses to rounding (compiled kernels round
    differently; Newton-Schulz runs in bf16). The compiled HellaSwag (and, in the DDP run, CORE's 5 tasks of
    3, which share HellaSwag's graph) equals an eager one-process evaluation, samples are drawn, and the
    training steps and evaluation after the first evaluation compile nothing new (tests/test_gpu.py checks
    this on a GPU)."""
    import core_eval
    from gptlib.checkpoint import load_model
    from gptlib.gpu_check import recompiles
    from gptlib.runtime import Runtime
    from hellaswag import evaluate, load_examples, prepare
    data = write_jsonl(tmp_path / "hs.jsonl", [hellaswag_example(i) for i in range(7)])
    bundle = write_core_bundle(tmp_path / "bundle", n=3)
    log = tmp_path / "compiled"
    core = ["--core=3", f"--core_bundle={bundle}"]  # core_eval.py's own run is eager (test_core.py)
    extra = MODERN_RUN + core if wrap == "ddp" else ["--fsdp=True", "--grad_checkpoint=True"]
    r = train(run_args(text) + extra + ["--compile=True", "--hellaswag=7", f"--hellaswag_data={data}",
                                        f"--log_dir={log}"], cwd=tmp_path, nproc=1,
              env={"TORCH_LOGS": "recompiles", "PYTHONUNBUFFERED": "1"})
    before, after = recompiles(r.stdout, "step 4: hellaswag")
    assert before >= 1 and after == 0, r.stdout[-5000:]  # evaluation recompiles (no grad), once
    recs = records(log)
    hs = [rec for rec in recs if "hellaswag" in rec]
    assert [h["step"] for h in hs] == [4, 8] and hs[-1]["hellaswag_n"] == 7
    assert any("samples" in rec for rec in recs) and "sample: " in r.stdout
    ref, got = losses(modern_reference if wrap == "ddp" else reference[2]), losses(log)
    assert sorted(got) == sorted(ref) == list(range(1, 9))
    for s in ref:
        assert math.isclose(got[s], ref[s], rel_tol=1e-4 if wrap == "ddp" else 1e-5), (s, got[s], ref[s])
    model = load_model(checkpoints(log)[-1]).eval()
    eager = evaluate(model, prepare(load_examples(data), Runtime(), 1, model.config.block_size), Runtime())
    assert eager["acc_norm"] == hs[-1]["hellaswag"] and eager["acc"] == hs[-1]["hellaswag_acc"]
    if wrap == "ddp":
        cores = [rec for rec in recs if "core" in rec]
        assert [c["step"] for c in cores] == [4, 8]
        prepared = core_eval.Prepared(core_eval.load_tasks(bundle, 3), Runtime(), 1, model.config.block_size)
        eager_core = core_eval.evaluate(model, prepared, Runtime())
        assert eager_core["core"] == cores[-1]["core"]
        assert {label: t["accuracy"] for label, t in eager_core["tasks"].items()} == cores[-1]["core_tasks"]


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




def test_every_part_of_the_step_runs_compiled_under_ddp_and_fsdp(tmp_path):
    """Under FSDP, Dynamo breaks a whole-model graph at FSDP's hooks (before GPT.compile_regions the head and
    its cross-entropy then ran eager, and with grad_checkpoint nothing compiled); GPT.compile_regions compiles
    the embeddings, each block (its checkpoint inside) and the head + loss. On 2 gloo ranks under bf16
    autocast, DDP with grad_checkpoint and FSDP without and with it: no compute op of the step runs outside a
    compiled region (the profiler's tree), FSDP runs one region per block + 2 and gathers the blocks'
    parameters in bf16 (MixedPrecisionPolicy) with fp32 gradients, and its loss and gradients equal DDP's to
    bf16 rounding, compiled or eager."""
    worker = os.path.join(ROOT, "tests", "workers", "regions.py")
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                        worker], cwd=ROOT, env={**ENV, "PYTHONPATH": ROOT}, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    got = json.loads(r.stdout.split("RESULT ", 1)[1])
    assert len(got) == 4
    for name, run in got.items():
        assert run["grad_dtype"] == "torch.float32", name
        compiled = not name.endswith("compile=None")
        if compiled:
            assert run["eager"] == {} and run["regions"] >= 1, (name, run["eager"], run["regions"])
        if name.startswith("fsdp"):
            assert run["gathered"] == ["torch.bfloat16"], (name, run["gathered"])
            assert run["regions"] == (3 + 2 if compiled else 0), (name, run["regions"])
            ddp = got["ddp grad_checkpoint=True compile=aot_eager"]  # the same loss and gradients either way
            assert math.isclose(run["loss"], ddp["loss"], rel_tol=1e-3), (name, run["loss"], ddp["loss"])
            for param, g in run["grads"].items():
                ref = ddp["grads"][param]
                scale = max(abs(v) for v in ref) or 1.0
                assert max(abs(a - b) for a, b in zip(g, ref)) <= 2e-2 * scale, (name, param)
