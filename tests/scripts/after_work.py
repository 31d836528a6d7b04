"""Test job (issue 39): every rank joins the process group and averages one value; rank --rank then aborts
(SIGABRT, nothing said) either during the work (before runtime.shutdown()) or after it, as a script whose native
threads outlive the interpreter can."""
import argparse
import os
import time

import torch

from clusterddp import runtime

p = argparse.ArgumentParser()
p.add_argument("--rank", type=int, default=3)
p.add_argument("--when", choices=("during", "after"), default="after")
args = p.parse_args()
runtime.init()
value = runtime.all_reduce_mean(torch.tensor(float(runtime.rank())))
runtime.print0(f"MEAN {value.item()}")
if args.when == "during" and runtime.rank() == args.rank:
    os.abort()
runtime.shutdown()
print(f"rank {os.environ['RANK']}: DONE", flush=True)
if args.when == "after" and int(os.environ["RANK"]) == args.rank:
    time.sleep(0.5)  # the others' work is over too
    os.abort()
