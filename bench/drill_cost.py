"""Bench item 14 (issues 26, 56): `clusterddp drill` of examples/train_ddp.py with the README's arguments at its default
shape (2 emulated nodes x 2 ranks), against one local run of the same job measured in the same run (medians of
RUNS, interleaved). The drill runs the job three times: the reference, and one job that loses node 0 (retried on
a spare), then stops at a step as at a time limit, and its resume; one after another (CLUSTERDDP_DRILL_SERIAL=1)
or, by default, the second beside the reference from its first checkpoint. Target (issue 56): <= 4x.
``python -m bench --only 14``."""
from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Tuple

ROOT = Path(__file__).resolve().parent.parent
RUNS = 2
SMALL = ["--epochs", "1", "--ckpt-every", "2"]  # the README's drill line (8 steps at 2 x 2)
SHAPE = ["--nodes", "2", "--procs-per-node", "2"]


def _timed(argv: List[str], cwd: Path, serial: bool = False) -> float:
    env = dict(os.environ, XDG_STATE_HOME=str(cwd / "state"))
    env.pop("CLUSTERDDP_DRILL_SERIAL", None)
    if serial:
        env["CLUSTERDDP_DRILL_SERIAL"] = "1"
    start = time.monotonic()
    subprocess.run(argv, cwd=cwd, env=env, check=True, capture_output=True, timeout=1800)
    return time.monotonic() - start


def rows(work: Path) -> List[Tuple[str, str, str, str]]:
    shutil.copy(ROOT / "examples" / "train_ddp.py", work)
    one, serial, side = [], [], []
    drill = [sys.executable, "-m", "clusterddp", "drill", *SHAPE, "train_ddp.py", "--", *SMALL]
    for _ in range(RUNS):
        one.append(_timed([sys.executable, "-m", "clusterddp", "submit", "--local", *SHAPE, "train_ddp.py", "--",
                           *SMALL], work))
        serial.append(_timed(drill, work, serial=True))
        side.append(_timed(drill, work))
    b = statistics.median(one)
    spread = f"runs: one {', '.join(f'{t:.1f}' for t in one)} s; serial {', '.join(f'{t:.1f}' for t in serial)} s; " \
             f"side by side {', '.join(f'{t:.1f}' for t in side)} s"
    a, c = statistics.median(serial), statistics.median(side)
    return [("14", "clusterddp drill of examples/train_ddp.py (the README's line, 2 x 2 ranks: 3 runs, the stop in "
                   f"the kill's job), one after another / one local run; medians of {RUNS}",
             f"{a:.1f} s / {b:.1f} s = {a / b:.2f}x", ""),
            ("14", f"the same drill, the kill's job beside the reference (the default) / one local run; medians of "
                   f"{RUNS} ({spread})", f"{c:.1f} s / {b:.1f} s = {c / b:.2f}x", "<= 4x")]


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory(prefix="clusterddp-bench-") as tmp:
        for row in rows(Path(tmp)):
            print(f"| {' | '.join(row)} |")
