"""Prints one line per rank, then sleeps (for status / logs / cancel tests). ``sleeper.py SECONDS ignore-term``: a rank
that ignores SIGTERM (as one that asked for should_stop() and is blocked elsewhere does)."""
import os
import signal
import sys
import time

if sys.argv[2:3] == ["ignore-term"]:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
print(f"sleeper rank {os.environ.get('RANK')} started pid {os.getpid()}", flush=True)
time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 120)
print(f"sleeper rank {os.environ.get('RANK')} done", flush=True)
