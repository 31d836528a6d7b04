"""Torch-free test job that never asks should_stop(): it prints, then sleeps --seconds (only srun's SIGTERM after
--stop-grace ends it early)."""
import argparse
import time

p = argparse.ArgumentParser()
p.add_argument("--seconds", type=float, default=120)
args = p.parse_args()
print("started", flush=True)
time.sleep(args.seconds)
print("slept to the end", flush=True)
