"""The process tree from /proc (Linux), for tests that kill or count a job's processes."""
from __future__ import annotations

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


def descendants(pid: int) -> set:
    """Every process below ``pid``."""
    tree, found, todo = children(), set(), [pid]
    while todo:
        for c in tree.get(todo.pop(), []):
            found.add(c)
            todo.append(c)
    return found
