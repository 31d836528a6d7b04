"""Bench item 13 (issues 25 and 55): a lost node on the test cluster, from the kill to training again, by both
recovery paths in one run: peer heal (the default: the survivors' memory) and the checkpoint (--no-peer-heal).

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
from typing import List, Tuple

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
        if any(w.endswith("resumable.py") for w in words) and not any(
                "torchrun" in w or w.endswith("bash") for w in words[:2]):
            found.append(int(pid))
    return found


def _lines(path: Path) -> int:
    try:
        return len(path.read_text().splitlines())
    except OSError:
        return 0


def one(work: Path, n: int, env: dict, peer: bool = True) -> Tuple[float, float, int]:
    """(submit to first step s, kill to first step after it s, steps run twice) of one job."""
    log, d = work / f"run{n}.log", work
    argv = [sys.executable, "-m", "clusterddp", "submit", "--launcher", "srun", "--nodes", "2", "--spare-nodes", "1",
            "--gpus", "2", "--time", "10", "--wait", *([] if peer else ["--no-peer-heal"]), "resumable.py", "--",
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
    victims = _rank_pids("node2")
    for pid in victims:
        os.kill(pid, signal.SIGKILL)
    killed, before = time.monotonic(), _lines(log)
    while _lines(log) <= before and job.poll() is None:
        time.sleep(0.02)
    again = time.monotonic() - killed
    job.communicate(timeout=300)
    if job.returncode != 0 or len(victims) != 2:
        raise RuntimeError(f"job {n} ended {job.returncode} (killed {len(victims)} ranks)")
    steps = [int(line.split()[1]) for line in log.read_text().splitlines()]
    return first, again, len(steps) - len(set(steps))


def rows(work: Path) -> List[Tuple[str, str, str, str]]:
    import shutil

    shutil.copy(ROOT / "tests" / "scripts" / "resumable.py", work)
    env = dict(os.environ, XDG_STATE_HOME=str(work / "state"))
    found: dict = {True: [], False: []}
    for n in range(RUNS):
        for peer in (True, False):
            found[peer].append(one(work, 2 * n + (not peer), env, peer))
            subprocess.run([sys.executable, "-m", "clusterddp", "nodes", "--forget", "node2"], env=env, cwd=work,
                           capture_output=True)
    out = []
    for peer, name in ((True, "peer heal (default)"), (False, "checkpoint (--no-peer-heal)")):
        first = statistics.median(f for f, _, _ in found[peer])
        again = statistics.median(a for _, a, _ in found[peer])
        redone = max(r for _, _, r in found[peer])
        out += [("13", f"a lost node (node2's ranks SIGKILLed), 2x2 with 1 spare, srun, {name}: kill to training "
                       f"again / the job's own start (sbatch to first step); medians of {RUNS}",
                 f"{again:.1f} s / {first:.1f} s = {again / first:.2f}x",
                 "<= 5 s and <= 0.5x" if peer else "< 60 s"),
                ("13", f"{name}: steps logged twice after the kill (a checkpoint every {EVERY} steps), most of {RUNS}",
                 f"{redone}", "<= 1" if peer else f"<= {EVERY}")]
    return out

if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory(prefix="clusterddp-bench-") as tmp:
        for row in rows(Path(tmp)):
            print(f"| {' | '.join(row)} |")
