"""Test job for torchrun and srun launchers: one gloo all-reduce, one RESULT line per rank.

Uses raw torch.distributed and the standard env variables (RANK, WORLD_SIZE, MASTER_ADDR, ...), so it proves
what the launcher provides, independent of clusterddp.runtime.
"""
import argparse
import json
import os
import socket
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--fail-rank", type=int, default=-1)
p.add_argument("--echo", nargs="*", default=[])
args = p.parse_args()

rank = int(os.environ["RANK"])
world = int(os.environ["WORLD_SIZE"])
dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=60))
if rank == args.fail_rank:
    raise RuntimeError(f"deliberate failure on rank {rank}")
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
result = {
    "rank": rank, "local_rank": int(os.environ["LOCAL_RANK"]), "world_size": world,
    "local_world_size": int(os.environ.get("LOCAL_WORLD_SIZE", -1)), "host": socket.gethostname(),
    "master_addr": os.environ["MASTER_ADDR"], "sum": t.item(), "argv": sys.argv[1:],
    "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"), "node_id": os.environ.get("SLURM_NODEID"),
}
sys.stdout.write("RESULT " + json.dumps(result) + "\n")  # one write: ranks share a log
sys.stdout.flush()
dist.barrier()
dist.destroy_process_group()
