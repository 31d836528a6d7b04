"""In-process cost of the control plane (bench item 9): the control thread's CPU time per second of training, and
the price of one heartbeat() against one should_stop() on the CPU channel. One rank, run by `python -m bench`."""
import os
import sys
import tempfile
import time
import timeit

os.environ.update({"CLUSTERDDP_HANG_TIMEOUT": "900", "CLUSTERDDP_RUN_DIR": tempfile.mkdtemp()})
from clusterddp import runtime  # noqa: E402
from clusterddp.runtime import group  # noqa: E402

seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 10.0
runtime.init(allow_single=True, environ={k: v for k, v in os.environ.items() if not k.startswith("SLURM_")})
thread = group.STATE["control"].thread
clock = time.pthread_getcpuclockid(thread.ident)
cpu0, wall0 = time.clock_gettime(clock), time.monotonic()
while time.monotonic() - wall0 < seconds:  # a busy "training" main thread, beating as the loader would
    runtime.heartbeat()
    sum(range(2000))
cpu = time.clock_gettime(clock) - cpu0
wall = time.monotonic() - wall0
beat = min(timeit.repeat(runtime.heartbeat, number=100_000, repeat=5)) / 100_000
print(f"control thread CPU {cpu * 1000:.2f} ms over {wall:.1f} s = {100 * cpu / wall:.4f}% of a core; "
      f"heartbeat() {beat * 1e9:.0f} ns")
runtime.shutdown()
