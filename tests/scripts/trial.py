"""A sweep's trial (tests/test_sweep*.py): a few DDP steps whose loss depends on --lr and --seed, reported with
runtime.report; --fail-when LR,SEED fails that configuration on purpose. It writes what it saw (its arguments,
its CLUSTERDDP_PARAM_* variables, the array job) to seen.json in its run directory."""
import argparse
import json
import os
import sys
import time

from clusterddp import runtime

p = argparse.ArgumentParser()
p.add_argument("--lr", required=True)
p.add_argument("--seed", required=True)
p.add_argument("--fail-when", default="")
p.add_argument("--steps", type=int, default=3)
p.add_argument("--sleep", type=float, default=0.0)
a = p.parse_args()
env = runtime.init()
if runtime.is_main():
    seen = {"argv": sys.argv[1:], "params": {k: v for k, v in os.environ.items() if k.startswith("CLUSTERDDP_PARAM_")},
            "trial": os.environ.get("CLUSTERDDP_TRIAL"), "array_job": os.environ.get("SLURM_ARRAY_JOB_ID"),
            "cwd": os.getcwd(), "version": "original"}
    with open(os.path.join(os.environ["CLUSTERDDP_RUN_DIR"], "seen.json"), "w") as fh:
        json.dump(seen, fh)
if a.fail_when == f"{a.lr},{a.seed}":
    raise SystemExit(f"trial lr={a.lr} seed={a.seed} fails by design")
for step in range(a.steps):
    time.sleep(a.sleep)
    loss = runtime.all_reduce_mean(float(a.lr) * (a.steps - step) + int(a.seed) + runtime.rank())
    runtime.report(step=step, loss=loss, acc=1.0 / (1.0 + float(loss)))
runtime.shutdown()
