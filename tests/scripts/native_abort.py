"""Torch-free test job: every rank ends its work; then rank --rank aborts the way libstdc++ does when native
threads are still running at interpreter exit (its "terminate called ..." line, then abort()), as an unmodified
script that never destroys its process group can (issue 39)."""
import argparse
import os
import sys
import time

p = argparse.ArgumentParser()
p.add_argument("--rank", type=int, default=3)
args = p.parse_args()
rank = int(os.environ["RANK"])
print(f"rank {rank}: DONE", flush=True)
if rank == args.rank:
    time.sleep(0.5)  # after the others' work, as at the end of a real run
    sys.stderr.write("terminate called without an active exception\n")
    sys.stderr.flush()
    os.abort()
