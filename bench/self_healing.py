"""Bench item 13 (issues 25 and 55): a lost node on the test cluster, from the kill to training again, by every
recovery path in one run: peer heal (the default: the survivors' memory), peer heal with --warm-start (the retry's
ranks forked from a server per node that imported torch once), and the checkpoint (--no-peer-heal).

A 2-node job with --spare-nodes 1 (tests/scripts/resumable.py, 4 ranks, a checkpoint every EVERY steps); once rank 0
has logged KILL_AT steps, every rank process on node2 is SIGKILLed. Measured in the same run, the two paths
alternating: the job's own start, from sbatch to its first step (the baseline), and the time from the kill to the
first step after it (fault report, the health gate, new rendezvous on a spare, imports, the state's load), as a ratio
of the two; and the steps run twice. Root (network namespaces) and a running test cluster. ``python -m bench --only
13``.
"""
from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Tuple

ROOT = Path(__file__).resolve().parent.parent
EVERY, KILL_AT, RUNS = 4, 7, 3


def _rank_pids(node: str) -> List[int]:
    pids = subprocess.run(["ip", "netns", "pids", f"cddp-{node}"], capture_output=True, text=True).stdout.split()
    found = []
    for pid in pids:
        try:
            words = [w.decode() for w in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if w]
        except OSError:
            continue
        if any(w.endswith("resumable.py") for w in words) and "clusterddp.runtime.agent" not in words and not any(
                "torchrun" in w or w.endswith("bash") for w in words[:2]):  # (not an agent, warm or not)
            found.append(int(pid))
    return found


def _lines(path: Path) -> int:
    try:
        return len(path.read_text().splitlines())
    except OSError:
        return 0


def _phases(run_dir: Path, batch_log: Path, killed_at: float, world: int) -> Dict[str, float]:
    """What the recovery has reached, each seen from files (the batch log, the health gate's directory, the ranks'
    hello files, rank 0's recovery line); polled, so each is known to within the polling interval."""
    import json

    seen: Dict[str, float] = {}
    text = batch_log.read_text(errors="replace") if batch_log.is_file() else ""
    if "clusterddp: attempt 1 failed" in text:
        seen["the supervisor's verdict (srun ended, the fault read)"] = 1
    if (run_dir / "health" / "0.1").is_dir():
        seen["the health gate started on the spare"] = 1
    if "clusterddp: attempt 2 on" in text:
        seen["attempt 2 launched (gate, supervisor, port checked)"] = 1
    hellos = []
    for rank in range(world):
        try:
            hellos.append(json.loads((run_dir / "stacks" / "ranks" / f"rank-{rank}.json").read_text()))
        except (OSError, ValueError):
            pass
    fresh = [h for h in hellos if float(h.get("time", 0)) > killed_at]
    if len(fresh) == world:
        seen["every rank started (Python, torch and the script imported)"] = 1
        if all(h.get("state") in ("joined", "left") for h in fresh):
            seen["every rank joined (the rendezvous)"] = 1
    try:
        lines = (run_dir / "recovery.jsonl").read_text().splitlines()
    except OSError:
        lines = []
    if any(float(json.loads(line).get("time", 0)) > killed_at for line in lines if line.strip()):
        seen["rank 0 loaded the state (peer heal or the checkpoint)"] = 1
    return seen


# mode: (name, launcher, options); CLUSTERDDP_BENCH13_MODES picks some (comma-separated; default: all, alternating)
MODES = {"peer": ("peer heal (default)", "srun", []), "warm": ("peer heal with --warm-start", "srun", ["--warm-start"]),
         "ckpt": ("checkpoint (--no-peer-heal)", "srun", ["--no-peer-heal"]),
         "tpeer": ("peer heal (default)", "torchrun", []),
         "twarm": ("peer heal with --warm-start", "torchrun", ["--warm-start"])}
# the job's own start without warm starts, per launcher: the fair baseline of a warm mode (its servers import torch
# beside the first attempt's ranks, slower where cores are few)
PLAIN = {"srun": "peer", "torchrun": "tpeer"}


def one(work: Path, n: int, env: dict, mode: str = "peer") -> Tuple[float, float, int, Dict[str, float]]:
    """(submit to first step s, kill to first step after it s, steps run twice, {phase: s after the kill}) of one
    job."""
    log, d = work / f"run{n}.log", work
    argv = [sys.executable, "-m", "clusterddp", "submit", "--launcher", MODES[mode][1], "--nodes", "2",
            "--spare-nodes", "1", "--gpus", "2", "--time", "10", "--wait", *MODES[mode][2], "resumable.py", "--",
            "--ckpt-dir", str(d / f"ck{n}"), "--out", str(d / f"o{n}.pt"), "--steps-log", str(log),
            "--step-sleep", "0.3", "--ckpt-every", str(EVERY)]
    start = time.monotonic()
    job = subprocess.Popen(argv, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while _lines(log) == 0:
        if job.poll() is not None:
            raise RuntimeError(f"job {n} ended before its first step: {job.communicate()[1][-500:]}")
        time.sleep(0.02)
    first = time.monotonic() - start
    while _lines(log) < KILL_AT:
        time.sleep(0.02)
    runs = sorted((work / "clusterddp-runs").glob("resumable-*/"), key=lambda d: d.stat().st_mtime)
    run_dir = runs[-1]
    victims = _rank_pids("node2")  # (with --warm-start: the ranks' tasks, and the ranks their server forked)
    if "--warm-start" in MODES[mode][2]:
        import re

        victims += [int(p) for p in re.findall(r"forked rank process (\d+) \(RANK=[23] ",
                                               (run_dir / "warm-node2.out").read_text())]
    for pid in victims:
        os.kill(pid, signal.SIGKILL)
    killed, before, wall = time.monotonic(), _lines(log), time.time()
    phases: Dict[str, float] = {}
    while _lines(log) <= before and job.poll() is None:
        for name in _phases(run_dir, run_dir.with_suffix(".out"), wall, 4):
            phases.setdefault(name, time.monotonic() - killed)
        time.sleep(0.02)
    again = time.monotonic() - killed
    job.communicate(timeout=300)
    if job.returncode != 0 or len(victims) != (4 if "--warm-start" in MODES[mode][2] else 2):
        raise RuntimeError(f"job {n} ended {job.returncode} (killed {len(victims)} ranks)")
    steps = [int(line.split()[1]) for line in log.read_text().splitlines()]
    return first, again, len(steps) - len(set(steps)), phases


def rows(work: Path) -> List[Tuple[str, str, str, str]]:
    import shutil

    shutil.copy(ROOT / "tests" / "scripts" / "resumable.py", work)
    env = dict(os.environ, XDG_STATE_HOME=str(work / "state"))
    chosen = [m for m in os.environ.get("CLUSTERDDP_BENCH13_MODES", ",".join(MODES)).split(",") if m in MODES]
    found: dict = {mode: [] for mode in chosen}
    for n in range(RUNS):
        for i, mode in enumerate(chosen):
            found[mode].append(one(work, len(chosen) * n + i, env, mode))
            subprocess.run([sys.executable, "-m", "clusterddp", "nodes", "--forget", "node2"], env=env, cwd=work,
                           capture_output=True)
    out = []
    for mode in chosen:
        name, launcher, options = MODES[mode]
        peer = mode != "ckpt"
        first = statistics.median(f for f, _, _, _ in found[mode])
        again = statistics.median(a for _, a, _, _ in found[mode])
        redone = max(r for _, _, r, _ in found[mode])
        # (with --warm-start the servers import torch beside the first attempt's ranks: its own start is slower
        # where cores are few; the job's start without them, the default's, is the fair baseline)
        plain = [f for f, _, _, _ in found.get(PLAIN[launcher], [])]
        versus = (f"; against the default's own start {statistics.median(plain):.1f} s: "
                  f"{again / statistics.median(plain):.2f}x" if "--warm-start" in options and plain else "")
        name = f"{launcher}, {name}"
        out += [("13", f"a lost node (node2's ranks SIGKILLed), 2x2 with 1 spare, {name}: kill to training "
                       f"again / the job's own start (sbatch to first step); medians of {RUNS}",
                 f"{again:.1f} s / {first:.1f} s = {again / first:.2f}x{versus}",
                 "<= 5 s and <= 0.5x" if peer else "< 60 s"),
                ("13", f"{name}: steps logged twice after the kill (a checkpoint every {EVERY} steps), most of {RUNS}",
                 f"{redone}", "<= 1" if peer else f"<= {EVERY}")]
        names = [k for k in found[mode][0][3]]  # (in the order first seen)
        timeline = "; ".join(f"{k}: {statistics.median(r[3][k] for r in found[mode] if k in r[3]):.1f} s"
                             for k in names)
        out.append(("13", f"{name}: where the time from the kill goes, each phase seen reached (s after the kill, "
                          f"medians of {RUNS}; the first step after it ends the count)",
                    f"{timeline}; first step done: {again:.1f} s", ""))
    return out

if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory(prefix="clusterddp-bench-") as tmp:
        for row in rows(Path(tmp)):
            print(f"| {' | '.join(row)} |")
