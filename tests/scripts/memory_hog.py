"""Torch-free test job: rank --rank takes more and more memory (touched, 50 MB at a time, up to --cap MB) while the
others wait; a cluster that limits memory kills the step (issue 39's out-of-memory case)."""
import argparse
import os
import time

p = argparse.ArgumentParser()
p.add_argument("--rank", type=int, default=3)
p.add_argument("--cap", type=int, default=2000)
args = p.parse_args()
rank = int(os.environ["RANK"])
print(f"rank {rank}: started", flush=True)
hog = []
if rank == args.rank:
    while len(hog) * 50 < args.cap:
        hog.append(bytearray(50 << 20))  # zero-filled: every page touched
        time.sleep(0.05)
time.sleep(30)
print(f"rank {rank}: DONE", flush=True)
