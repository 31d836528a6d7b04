"""Bench item 15 (issue 27): what a sweep asks of Slurm. On the running test cluster, N trials of one grid,
submitted held (nothing runs) and cancelled after:

- as `clusterddp sweep` (one job array) against N times `clusterddp submit` of the same job, one per value;
- `clusterddp sweep status NAME` against `clusterddp status JOBID` for each of the N jobs.

Every Slurm command clusterddp runs goes through a logging stand-in on PATH (which then runs the real one), so
the counts are the commands sent to the controller; wall times are measured in the same run. Root and a running
test cluster (sudo tests/slurm/cluster.sh up). ``python -m bench --only 15``.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Tuple

ROOT = Path(__file__).resolve().parent.parent
N = 24
COMMANDS = ("sbatch", "squeue", "scontrol", "sacct", "sinfo", "scancel", "srun")
SHAPE = ["--nodes", "1", "--gpus", "0", "--procs-per-node", "2", "--launcher", "srun", "--time", "5",
         "--sbatch-arg=--hold"]


def _shims(work: Path) -> Tuple[Path, Path]:
    """A directory of stand-ins that append their name to a log and exec the real command."""
    shims, log = work / "shims", work / "calls.log"
    shims.mkdir()
    for name in COMMANDS:
        real = shutil.which(name)
        if real:
            (shims / name).write_text(f'#!/bin/sh\necho {name} >> "{log}"\nexec "{real}" "$@"\n')
            (shims / name).chmod(0o755)
    return shims, log


def _run(argv: List[str], cwd: Path, env: Dict[str, str], log: Path) -> Tuple[float, int, str]:
    log.write_text("")
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "clusterddp", *argv], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)
    took = time.monotonic() - start
    if proc.returncode != 0:
        raise RuntimeError(f"clusterddp {' '.join(argv[:3])} failed: {proc.stderr[-300:]}")
    return took, len(log.read_text().split()), proc.stdout


def rows(work: Path) -> List[Tuple[str, str, str, str]]:
    shims, log = _shims(work)
    proj = work / "proj"
    proj.mkdir()
    shutil.copy(ROOT / "tests" / "scripts" / "trial.py", proj)
    env = {**os.environ, "PATH": f"{shims}{os.pathsep}{os.environ['PATH']}", "XDG_STATE_HOME": str(work / "state")}
    values = ",".join(f"0.{i + 1:02d}" for i in range(N))
    ids: List[str] = []
    try:
        t_sweep, c_sweep, out = _run(["sweep", "--name", "calls", "--grid", f"lr={values}", *SHAPE, "trial.py",
                                      "--", "--lr", "{lr}", "--seed", "0"], proj, env, log)
        ids.append(out.split()[0])
        t_many = c_many = 0.0
        for i in range(N):
            took, calls, out = _run(["submit", *SHAPE, "trial.py", "--", "--lr", f"0.{i + 1:02d}", "--seed", "0"],
                                    proj, env, log)
            t_many, c_many = t_many + took, c_many + calls
            ids.append(out.split()[0])
        t_status, c_status, _ = _run(["sweep", "status", "calls"], proj, env, log)
        t_each = c_each = 0.0
        for job in ids[1:]:
            took, calls, _ = _run(["status", job], proj, env, log)
            t_each, c_each = t_each + took, c_each + calls
    finally:
        if ids:
            subprocess.run(["scancel", *ids], capture_output=True)
    return [("15", f"a {N}-trial grid: N x `clusterddp submit` / `clusterddp sweep` (one array); Slurm commands "
                   "and wall time, measured in the same run",
             f"{c_many:.0f} / {c_sweep} commands = {c_many / c_sweep:.1f}x; {t_many:.1f} s / {t_sweep:.1f} s = "
             f"{t_many / t_sweep:.1f}x", "one submission for the grid"),
            ("15", f"N x `clusterddp status JOBID` / `clusterddp sweep status` of the {N} trials",
             f"{c_each:.0f} / {c_status} commands = {c_each / c_status:.1f}x; {t_each:.1f} s / {t_status:.1f} s = "
             f"{t_each / t_status:.1f}x", "one query for the sweep")]
