"""Test job for the spawn launcher, written like pytorch/examples' imagenet main.py (main_worker pattern)."""
import argparse
import json
import os
import socket
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def main_worker(local_rank, ngpus_per_node, args):
    rank = args.rank * ngpus_per_node + local_rank
    dist.init_process_group("gloo", init_method=args.dist_url, world_size=args.world_size, rank=rank,
                            timeout=timedelta(seconds=60))
    if rank == args.fail_rank:
        raise RuntimeError(f"deliberate failure on rank {rank}")
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    sys.stdout.write("RESULT " + json.dumps({
        "rank": rank, "local_rank": local_rank, "world_size": args.world_size, "host": socket.gethostname(),
        "master_addr": args.dist_url.split("//")[1].rsplit(":", 1)[0], "sum": t.item(), "argv": sys.argv[1:],
        "node_id": os.environ.get("SLURM_NODEID")}) + "\n")  # one write: the node's ranks share a log
    sys.stdout.flush()
    dist.barrier()
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dist-url", required=True)
    p.add_argument("--world-size", type=int, required=True)   # number of nodes, as in the imagenet example
    p.add_argument("--rank", type=int, required=True)         # node rank
    p.add_argument("--procs", type=int, required=True)
    p.add_argument("--multiprocessing-distributed", action="store_true")
    p.add_argument("--fail-rank", type=int, default=-1)
    p.add_argument("--echo", nargs="*", default=[])
    args = p.parse_args()
    args.world_size = args.procs * args.world_size
    mp.spawn(main_worker, nprocs=args.procs, args=(args.procs, args))


if __name__ == "__main__":
    main()
