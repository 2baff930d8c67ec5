"""Each of 2 gloo ranks (torchrun) shards a 3-block model with FSDP2 and writes to DIR/rank<r>.json (argv[1])
what it holds against accounting.py's estimate, then how each rank left two failures that one rank meets
alone: rank 0's checkpoint write on a full disk (under FSDP: checkpoint.save_run), and Ctrl-C on rank 1 inside
runtime.together. tests/test_fsdp.py."""
import errno, json, os, sys, time, torch, torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from gptlib import checkpoint, runtime
from gptlib.accounting import training_memory
from model import GPT, GPTConfig
from gptlib.optimizers import ROLES, make_optimizers
rt = runtime.setup("cpu", "fp32", timeout=60)
torch.manual_seed(0)
config = GPTConfig(block_size=64, vocab_size=50304, n_layer=3, n_head=2, n_embd=48)
model = GPT(config)
for block in model.transformer.h:
    fully_shard(block)
fully_shard(model)
opt, = make_optimizers(model, "adamw", 0.1, dict.fromkeys(ROLES, 1e-3), fused=False)
x = torch.randint(0, 50257, (2, 64))
model(x, x)[1].backward()
opt.step()
params = sum(p.to_local().numel() * p.element_size() for p in model.parameters())
adamw = sum(t.to_local().numel() * t.element_size()
            for s in opt.state.values() for k, t in s.items() if k != "step")
est = training_memory(config, 2, 64, "fp32", shards=dist.get_world_size())
result = {"rank": rt.rank, "params": params, "adamw": adamw, "est_params": est["params"],
          "est_adamw": est["adamw"], "full": 4 * model.num_params()}


def how_it_ended(block):
    """(the exception's type, its rank attribute, seconds) of block(), or ("none", None, seconds)."""
    t0 = time.time()
    try:
        block()
    except BaseException as e:
        return type(e).__name__, getattr(e, "rank", None), time.time() - t0
    return "none", None, time.time() - t0


def full_disk(obj, path):
    raise OSError(errno.ENOSPC, "No space left on device")


if rt.master:
    checkpoint.torch.save = full_disk  # rank 0 writes; it alone meets the full disk
meta = {"step": 1}
result["write"] = how_it_ended(lambda: checkpoint.save_run(sys.argv[1], model, [opt], meta, rt, keep=1))


def interrupted():
    with runtime.together(rt):
        if rt.rank == 1:
            raise KeyboardInterrupt
result["ctrl_c"] = how_it_ended(interrupted)
result["log"] = how_it_ended(lambda: runtime.agree(rt, "rank 0 cannot log" if rt.master else None))
result["after"] = how_it_ended(lambda: runtime.agree(rt))  # the ranks still agree
with open(os.path.join(sys.argv[1], f"rank{rt.rank}.json"), "w") as f:  # not one shared stdout
    json.dump(result, f)
runtime.exit_process(0)  # gloo's threads may outlive a plain exit (runtime.exit_process says why)
