"""Start-up benchmark job: initialise the process group, one all-reduce, exit."""
import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo", rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
t = torch.ones(1)
dist.all_reduce(t)
assert t.item() == int(os.environ["WORLD_SIZE"])
if os.environ.get("BENCH_MARKER") and int(os.environ["RANK"]) == 0:  # every rank has joined: tell the timer
    open(os.environ["BENCH_MARKER"], "w").close()
dist.destroy_process_group()
