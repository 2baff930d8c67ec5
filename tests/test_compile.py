"""torch.compile through train_gpt2.py: compiled DDP (with Muon) and FSDP runs on 2 gloo ranks against the
eager one-process run, with compiled evaluations that compile nothing new after the first; and the probe that
finds out before training that compile cannot work here."""
import json
import math
import subprocess
import sys
import textwrap

import pytest

from checkpoint import checkpoints
from conftest import (ENV, MODERN_RUN, ROOT, SCRIPT, TINY, hellaswag_example, losses, records, run_args,
                      train, write_jsonl)

pytestmark = pytest.mark.slow  # every test here starts processes or compiles


@pytest.mark.parametrize("wrap", ["ddp", "fsdp"])
def test_compiled_ranks_match_the_eager_one_process_run(tmp_path, text, reference, modern_reference, wrap):
    """torch.compile under torchrun with DDP inside it (here --recipe=modern: rotary, QK-norm and the rest
    compiled, DDP's buckets split the graph, no_sync skips the all-reduce of 3 micro-steps in 4, and Muon
    orthogonalizes the gradients DDP reduces), on one rank: each rank compiles the same graphs, and gradient
    sync under compile across 2 ranks is test_every_part_of_the_step's; or on the FSDP-sharded GPT-2 (AdamW)
    over 2 gloo ranks x 2 micro-steps. Either gives the eager one-process run's losses to rounding (compiled
    kernels round differently; Newton-Schulz runs in bf16). The compiled HellaSwag (7 examples; on 2 ranks
    they get 4 and 3) equals an eager one-process evaluation, samples are drawn, and the training steps and
    evaluation after the first evaluation compile nothing new (tests/test_gpu.py checks this on a GPU)."""
    from checkpoint import load_model
    from gpu_check import recompiles
    from hellaswag import Prepared, evaluate, load_examples
    from runtime import Runtime
    data = write_jsonl(tmp_path / "hs.jsonl", [hellaswag_example(i) for i in range(7)])
    log = tmp_path / "compiled"
    extra = MODERN_RUN if wrap == "ddp" else ["--fsdp=True"]
    r = train(run_args(text) + extra + ["--compile=True", "--hellaswag=7", f"--hellaswag_data={data}",
                                        f"--log_dir={log}"], cwd=tmp_path, nproc=1 if wrap == "ddp" else 2,
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
    eager = evaluate(model, Prepared(load_examples(data), Runtime(), 1, model.config.block_size), Runtime())
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
REGIONS = textwrap.dedent("""
    import collections, json, sys
    import torch
    from torch.profiler import profile
    import runtime, train_gpt2
    from model import GPT, GPTConfig
    COMPUTE = ("aten::addmm", "aten::mm", "aten::bmm", "aten::linear", "aten::embedding", "aten::layer_norm",
               "aten::native_layer_norm", "aten::gelu", "aten::_scaled_dot_product", "aten::log_softmax",
               "aten::_log_softmax", "aten::nll_loss", "aten::cross_entropy")

    def compiled(event):
        while event is not None:
            if event.name.startswith(("Torch-Compiled Region", "CompiledFunction", "## Call CompiledFx")):
                return True
            event = event.cpu_parent
        return False

    rt = runtime.setup("cpu", "bf16")
    compile = torch.compile
    out = {}
    # DDP without grad_checkpoint (one whole-model graph) is what the other compile tests run. Where Dynamo
    # splits the graph does not depend on the backend: Inductor compiles the hardest case, aot_eager (the same
    # graphs run by aten ops, no C++ compiling) the others
    for fsdp, grad_checkpoint, backend in [(False, True, "aot_eager"), (True, False, "aot_eager"),
                                           (True, True, "inductor"), (True, False, None)]:
        torch._dynamo.reset()
        torch.compile = lambda fn, backend=backend: compile(fn, backend=backend)
        torch.manual_seed(0)
        raw = GPT(GPTConfig(block_size=64, vocab_size=256, n_layer=3, n_head=2, n_embd=32,
                            grad_checkpoint=grad_checkpoint))
        s = train_gpt2.Settings(fsdp=fsdp, compile=backend is not None)
        model = train_gpt2.wrap_model(raw, s, rt).train_model
        gathered = []
        if fsdp:  # after FSDP's own pre-forward hook, which gathers the block's parameters
            raw.transformer.h[0].register_forward_pre_hook(
                lambda m, args: gathered.append(str(m.attn.c_attn.weight.dtype)))
        x = torch.arange(2 * 64).view(2, 64) * (rt.rank + 1) % 256  # each rank its own batch
        for step in range(2):  # the second step: compiled, nothing left to compile
            raw.zero_grad()
            with profile() as prof:
                with runtime.autocast("cpu", "bf16"):
                    _, loss = model(x, x)
                loss.backward()
        events = prof.events()
        grads = {n: p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
                 for n, p in raw.named_parameters()}
        out[f"{'fsdp' if fsdp else 'ddp'} grad_checkpoint={grad_checkpoint} compile={backend}"] = {
            "regions": sum(e.name.startswith("Torch-Compiled Region") for e in events),
            "eager": dict(collections.Counter(e.name for e in events
                                              if e.name.startswith(COMPUTE) and not compiled(e))),
            "gathered": sorted(set(gathered)),
            "grad_dtype": str(grads["transformer.h.0.mlp.c_fc.weight"].dtype),
            "loss": loss.item(), "grads": {n: g.float().flatten()[:64].tolist() for n, g in grads.items()}}
    if rt.rank == 0:
        print("RESULT " + json.dumps(out))
    torch.distributed.destroy_process_group()
""")


def test_every_part_of_the_step_runs_compiled_under_ddp_and_fsdp(tmp_path):
    """Under FSDP, Dynamo breaks a whole-model graph at FSDP's hooks (before GPT.compile_regions the head and
    its cross-entropy then ran eager, and with grad_checkpoint nothing compiled); GPT.compile_regions compiles
    the embeddings, each block (its checkpoint inside) and the head + loss. On 2 gloo ranks under bf16
    autocast, DDP with grad_checkpoint and FSDP without and with it: no compute op of the step runs outside a
    compiled region (the profiler's tree), FSDP runs one region per block + 2 and gathers the blocks'
    parameters in bf16 (MixedPrecisionPolicy) with fp32 gradients, and its loss and gradients equal DDP's to
    bf16 rounding, compiled or eager."""
    worker = tmp_path / "regions.py"
    worker.write_text(REGIONS)
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                        str(worker)], cwd=ROOT, env={**ENV, "PYTHONPATH": ROOT}, capture_output=True,
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
