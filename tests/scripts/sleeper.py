"""Prints one line per rank, then sleeps (for status / logs / cancel tests)."""
import os
import sys
import time

print(f"sleeper rank {os.environ.get('RANK')} started pid {os.getpid()}", flush=True)
time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 120)
print(f"sleeper rank {os.environ.get('RANK')} done", flush=True)
