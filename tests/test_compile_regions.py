"""torch.compile region by region (GPT.compile_regions): on 2 gloo ranks under DDP and FSDP, with and without
activation checkpointing, no compute op of the training step runs outside a compiled region. (Apart from
test_compile.py so that the test workers share the compile tests out evenly.)"""
import json
import math
import subprocess
import sys
import textwrap

from conftest import ENV, ROOT


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

    rt = runtime.processes("cpu", "bf16")
    runtime.start(rt, compile=True)
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
        rt.compile = backend is not None
        model, _, _ = train_gpt2.wrap_model(raw, {"fsdp": fsdp}, rt)
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
