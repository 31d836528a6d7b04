"""Stacks of ranks that cannot answer themselves (unmodified scripts, or stuck in native code), through py-spy.

Runs on one node (``clusterddp stacks`` starts it there with ``srun --overlap``, or directly for --local runs):

    python -m clusterddp.runtime.pyspy RUN_DIR OUT_DIR

finds this node's rank processes of the job (their environment names the run directory and a RANK), and writes
``OUT_DIR/rank-N.json`` for each rank that has no dump yet. py-spy needs ptrace rights over the process: with
``kernel.yama.ptrace_scope`` 1 or more that takes CAP_SYS_PTRACE, and the reason is printed instead.
Imports no torch; exit code 1 when no rank could be dumped.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from .. import contract, rollcall
from .control import library_prefixes


def _environ(pid: int) -> Optional[Dict[str, str]]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    out = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            out[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return out


def _parent(pid: int) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    fields = stat[stat.rfind(")") + 2:].split()  # after "pid (comm)": state, ppid, ...
    return int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else 0


def claimants(run_dir: str) -> Dict[int, List[int]]:
    """rank -> pids of this node's processes of the job with this run directory. A process counts only when it is
    the invoking user's (a process's environment is its owner's to write: another user's process that names our
    run directory is not our rank, even for root), of this Slurm job where this runs inside one, and not a child
    of another claimant (a DataLoader worker inherits its rank's environment)."""
    want = os.path.realpath(run_dir)
    # Where nodes share a process table (containers, or the test cluster's namespaces), Slurm's node name tells
    # this node's tasks from the others'.
    here = os.environ.get("SLURMD_NODENAME")
    job = os.environ.get("SLURM_JOB_ID")
    found: Dict[int, int] = {}  # pid -> rank
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            if os.stat(f"/proc/{entry}").st_uid != os.getuid():
                continue
        except OSError:
            continue
        env = _environ(int(entry))
        if not env or not env.get("RANK", "").isdigit() or len(env["RANK"]) > 6:
            continue
        if here and env.get("SLURMD_NODENAME", here) != here:
            continue
        if job and env.get("SLURM_JOB_ID", job) != job:
            continue
        theirs = env.get(contract.RUN_DIR)  # (a process with RANK but no run directory is not a rank of ours;
        if theirs and "\0" not in theirs and os.path.realpath(theirs) == want:  # realpath("\0") raises)
            found[int(entry)] = int(env["RANK"])
    out: Dict[int, List[int]] = {}
    for pid, rank in sorted(found.items()):
        if found.get(_parent(pid)) != rank:
            out.setdefault(rank, []).append(pid)
    return out


def ranks_here(run_dir: str) -> List[Tuple[int, int]]:
    """(rank, pid) of this node's ranks of the job: the ranks exactly one process claims."""
    return sorted((rank, pids[0]) for rank, pids in claimants(run_dir).items() if len(pids) == 1)


def _py_spy() -> Optional[str]:
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


def to_dump(rank: int, pid: int, threads: List[Dict[str, Any]]) -> Dict[str, Any]:
    """py-spy's ``dump --json`` output (innermost frame first) as a roll-call dump (outermost first)."""
    prefixes = library_prefixes()
    out = []
    for t in threads:
        frames = [{"file": str(f.get("filename", "?")), "line": int(f.get("line") or 0), "func": str(f.get("name")),
                   "lib": rollcall.is_library(str(f.get("filename", "")), prefixes)}
                  for f in reversed(t.get("frames") or [])]
        out.append({"name": str(t.get("thread_name") or f"thread {t.get('thread_id')}"),
                    "main": t.get("os_thread_id") == pid, "frames": frames})
    out.sort(key=lambda t: not t["main"])
    return {"rank": rank, "node": socket.gethostname(), "pid": pid, "time": time.time(), "source": "py-spy",
            "threads": out}


def main(argv: List[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m clusterddp.runtime.pyspy RUN_DIR OUT_DIR", file=sys.stderr)
        return 2
    run_dir, out_dir = argv
    host = socket.gethostname()
    claims = claimants(run_dir)
    for rank, pids in sorted(claims.items()):
        if len(pids) > 1:
            print(f"{host}: rank {rank} is claimed by {len(pids)} processes (pids {', '.join(map(str, pids))}): "
                  "not dumped, since which is the rank cannot be told", file=sys.stderr)
    ranks = ranks_here(run_dir)
    if not ranks:
        if not claims:
            print(f"{host}: no rank process of this job here (no process with RANK and {contract.RUN_DIR}={run_dir};"
                  " the spawn launcher's workers are not found this way)", file=sys.stderr)
        return 1
    todo = [(r, p) for r, p in ranks if not (Path(out_dir) / f"rank-{r}.json").exists()]
    if not todo:
        return 0
    exe = _py_spy()
    if exe is None:
        print(f"{host}: py-spy is not installed where the job runs (pip install 'clusterddp[stacks]'), and "
              f"rank(s) {rollcall.ranges(r for r, _ in todo)} did not answer", file=sys.stderr)
        return 1
    done, why = 0, ""
    for rank, pid in todo:
        try:
            proc = subprocess.run([exe, "dump", "--json", "--pid", str(pid)], capture_output=True, text=True,
                                  timeout=30)
            threads = json.loads(proc.stdout) if proc.returncode == 0 else None
        except (subprocess.TimeoutExpired, ValueError):
            threads = None
            proc = None  # type: ignore[assignment]
        if not isinstance(threads, list):
            err = (proc.stderr.strip().splitlines() or ["no output"])[-1] if proc is not None else "timed out"
            why = (f"{host}: py-spy could not read rank {rank} (pid {pid}): {err}"
                   + (" (ptrace not permitted: kernel.yama.ptrace_scope?)" if "ermission" in err else ""))
            print(why, file=sys.stderr)
            continue
        rollcall.write_dump(Path(out_dir), to_dump(rank, pid, threads))
        done += 1
    return 0 if done else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
