"""The process tree from /proc (Linux), for tests that kill or count a job's processes."""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path


def children() -> dict:
    """pid -> its child pids, for every process now."""
    out: dict = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            out.setdefault(ppid, []).append(int(entry.name))
    return out


def launched(pid: int) -> list:
    """The processes a local runner ``pid`` started for its job: its children but its warm servers (issue 79:
    ``python -m clusterddp.runtime.warm serve``, the ranks' own processes being their clients)."""
    out = []
    for child in children().get(pid, []):
        try:
            argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[1:4] != [b"-m", b"clusterddp.runtime.warm", b"serve"]:
            out.append(child)
    return out


def descendants(pid: int) -> set:
    """Every process below ``pid``."""
    tree, found, todo = children(), set(), [pid]
    while todo:
        for c in tree.get(todo.pop(), []):
            found.add(c)
            todo.append(c)
    return found


def state(pid: int) -> str:
    """The process's state letter ("Z": a zombie its parent has not reaped yet); "" once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def kill_at_once(pids: list, timeout: float = 10.0) -> None:
    """SIGKILL ``pids`` the way a lost node loses them: all at once, as their parent (slurmstepd, or torchrun's
    agent) sees it. The parents are frozen (SIGSTOP) until every victim is dead, so they reap all of them in one
    pass and report them together ("tasks 2-3: Killed"). Killed one by one on a busy machine, slurmstepd can report
    the first alone; srun then begins ending the step and the second death reads as srun's own kill."""
    parents = {parent(pid) for pid in pids} - {0, 1, os.getpid()}
    for ppid in parents:
        os.kill(ppid, signal.SIGSTOP)
    try:
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + timeout
        while any(state(pid) not in ("Z", "") for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        for ppid in parents:
            os.kill(ppid, signal.SIGCONT)


def wait_for(predicate, timeout: float, what: str, interval: float = 0.5) -> None:
    """Until ``predicate()`` holds (an event, not a fixed sleep); fails the test naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout:.0f} s for {what}")
        time.sleep(interval)
