"""A process that joins a 1-rank gloo group (file argv[1]), prints, and exits through runtime.exit_process
with status argv[2] (tests/test_train.py)."""
from gptlib import runtime
import sys, torch.distributed as dist
dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
print("written before the exit", end="")
runtime.exit_process(int(sys.argv[2]))
print("never")
