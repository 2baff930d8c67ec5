"""One training step (forward + backward under bf16 autocast) of a 3-block model, wrapped by train_gpt2's
own wrap_model for DDP and FSDP with activation checkpointing off and on, profiled on every rank. Run by
tests/test_compile.py under torchrun (2 gloo ranks); rank 0 prints RESULT and a JSON line."""
import collections, json
import torch
from torch.profiler import profile
import train_gpt2
from gptlib import runtime
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
# splits the graph does not depend on the backend: aot_eager (the same graphs run by aten ops, no C++
# compiling; Inductor would take 30 s more here) compiles them; Inductor compiles the hardest case, FSDP with
# grad_checkpoint, in test_compiled_ranks_match_the_eager_one_process_run[fsdp]
for fsdp, grad_checkpoint, backend in [(False, True, "aot_eager"), (True, False, "aot_eager"),
                                       (True, True, "aot_eager"), (True, False, None)]:
    torch._dynamo.reset()
    torch.compile = lambda fn, backend=backend, **kw: compile(fn, backend=backend, **kw)
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
runtime.exit_process(0)  # gloo's threads may outlive a plain exit (runtime.exit_process says why)
