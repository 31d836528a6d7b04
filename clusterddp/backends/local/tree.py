"""The processes of a local run (its runner, torchrun agents, ranks) found from /proc: for the drill, which kills an
emulated node's ranks on purpose and must end every process of a run it gives up on. (The ranks live in sessions
of their own, so a signal to the runner's process group does not reach them.)"""
from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import Dict, List

from ... import contract


def descendants(root: int) -> List[int]:
    """Every process below ``root`` (from /proc; none where there is no /proc)."""
    tree: Dict[int, List[int]] = {}
    for entry in (Path("/proc").iterdir() if Path("/proc").is_dir() else ()):
        if entry.name.isdigit():
            try:
                tree.setdefault(int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]), []).append(
                    int(entry.name))
            except (OSError, IndexError, ValueError):
                continue
    found, todo = [], [root]
    while todo:
        for pid in tree.get(todo.pop(), []):
            todo.append(pid)
            found.append(pid)
    return found


def end_run(proc: subprocess.Popen) -> None:
    """End a run started in a session of its own (a drill's, a migrate check's) and every process it started (its
    ranks live in sessions of their own): Ctrl-C to the local runner, which stops its ranks; whatever is left after
    30 s is killed."""
    below = descendants(proc.pid)
    try:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=30)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
    for pid in [proc.pid, *below]:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    proc.wait()


def ranks_of_node(root: int, node: int, per: int) -> List[int]:
    """The processes below ``root`` that are ranks of emulated node ``node`` (RANK in its block: srun's and
    torchrun's ranks alike are laid out node by node)."""
    found = []
    for pid in descendants(root):
        try:
            env = dict(i.split("=", 1) for i in Path(f"/proc/{pid}/environ").read_bytes().decode(
                errors="replace").split("\0") if "=" in i)
        except OSError:
            continue
        rank = env.get("RANK", "")
        if rank.isdigit() and int(rank) // per == node and env.get(contract.DRILL_DIR):
            found.append(pid)
    return found
