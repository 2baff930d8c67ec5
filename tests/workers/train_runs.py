"""Several train_gpt2.py runs in one torchrun launch (tests/test_fsdp.py): train_gpt2.main(argv) of each in
turn, the process group taken down after each (the next main() sets it up again), so that the processes and
their imports start once, not once a run. argv[1]: a JSON list of [name, argv]; rank 0 prints "== RUN name"
before each run's output."""
import json
import sys

import torch.distributed as dist

import train_gpt2
from runtime import is_rank0

for name, argv in json.loads(sys.argv[1]):
    if is_rank0():
        print(f"== RUN {name}", flush=True)
    assert train_gpt2.main(argv) == 0, name
    sys.stdout.flush()
    dist.destroy_process_group()
