"""Test job for hangs in a script that does not use clusterddp.runtime: raw torch.distributed; --rank sleeps
before the first all_reduce while the others wait in it."""
import argparse
import time
from datetime import timedelta

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--rank", type=int, default=3)
p.add_argument("--ready-dir", default="", help="each rank leaves ready-RANK here once it is past its imports")
args = p.parse_args()


def stuck():
    time.sleep(3600)


def main():
    dist.init_process_group("gloo", timeout=timedelta(seconds=600))
    if args.ready_dir:
        open(f"{args.ready_dir}/ready-{dist.get_rank()}", "w").close()
    if dist.get_rank() == args.rank:
        stuck()
    t = torch.ones(1)
    dist.all_reduce(t)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
