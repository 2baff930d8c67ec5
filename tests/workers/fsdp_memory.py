"""Each of 2 gloo ranks (torchrun) shards a 3-block model with FSDP2 and writes what it holds against
accounting.py's estimate to DIR/rank<r>.json (argv[1]): tests/test_fsdp.py."""
import json, os, sys, torch, torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from accounting import training_memory
from model import GPT, GPTConfig
from optimizers import ROLES, make_optimizers
dist.init_process_group("gloo")
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
with open(os.path.join(sys.argv[1], f"rank{dist.get_rank()}.json"), "w") as f:  # not one shared stdout
    json.dump({"rank": dist.get_rank(), "params": params, "adamw": adamw, "est_params": est["params"],
               "est_adamw": est["adamw"], "full": 4 * model.num_params()}, f)
dist.destroy_process_group()
