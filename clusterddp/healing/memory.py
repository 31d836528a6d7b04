"""Slurm's own word that a step ran out of memory: the cgroup's OOM lines (srun, slurmstepd) and OverMemoryKill's
line in the first task's log of a node. The program's, always: it needs as much memory on any node."""
from __future__ import annotations

import calendar
import re
import time
from pathlib import Path
from typing import Optional, Sequence

from ..rollcall import printable
from .fault import PROGRAM, Fault, cite
from .launchers import OOM, OOM_STEP, OVER_MEMORY, expand, killed_tasks, tail


def out_of_memory(lines: Sequence[str]) -> Optional[Fault]:
    """Slurm's own report of an OOM kill: the program's (it needs as much memory on any node)."""
    for line in lines:
        m = OOM.match(line)
        if m:
            return Fault(PROGRAM, (), printable(
                f"out of memory on {m.group(1)} (rank(s) {m.group(2)}: Slurm's OOM kill): the program, not the node; "
                "it needs less memory per rank (a smaller batch) or more (--mem); sacct -j JOBID -o MaxRSS,ReqMem "
                "shows how much it used"), "Out Of Memory", tuple(expand(m.group(2))[:64]))
    for line in lines:
        m = OOM_STEP.match(line)
        if m:
            return Fault(PROGRAM, (), printable(f"out of memory: Slurm detected {m.group(1)} OOM kill(s) in the step: "
                                                "the program, not the node; it needs less memory per rank or more "
                                                "(--mem)"), "Out Of Memory")
    return None


def over_memory(logs: Sequence[Path], err: Sequence[str], job: str = "", since: float = 0) -> Optional[Fault]:
    """Slurm killed the step for using more memory than the job asked for (OverMemoryKill): slurmstepd's line in the
    log of a rank srun says was killed, of job ``job`` (where given) and written ``since`` (a Unix time; its clock is
    the node's local time, as srun's), the latest such. The program's: it needs as much on any node."""
    killed = killed_tasks(err)
    found = []
    for log in logs:
        # rank-T.out (srun: a task is a rank) or node-T.out (torchrun, spawn: one task per node, its agent)
        m = re.fullmatch(r"(?:rank|node)-(\d{1,7})\.out", log.name)
        number = m.group(1) if m else ""
        if not number.isdigit() or int(number) not in killed:
            continue
        for line in tail(log, 1 << 20):
            m = OVER_MEMORY.match(line)
            when = _clock(m.group("when"), m.group("zone")) if m and m.group("when") else None
            if m and (not job or m.group("job") == job) and (not since or when is not None and when >= since - SKEW_S):
                found.append((when or 0, int(number), line, int(m.group("used")) >> 20, int(m.group("limit")) >> 20,
                              log.name))
    if not found:
        return None
    _, task, line, used, limit, name = max(found)
    node = killed[task]
    return Fault(PROGRAM, (), printable(
        f"out of memory on {node}: Slurm killed the step there when it used {used} MiB, over the job's limit of "
        f"{limit} MiB per node: the program, not the node; it needs less memory per rank (a smaller batch) or more "
        "(--mem)"), "Killed", (task,) if name.startswith("rank-") else (), cite(name, line))


#: How far behind this node's clock a node's may be for its stamped line to count as this attempt's: the line is
#: also of this job and in this attempt's own log (set aside after each attempt), so the time is only a backstop.
SKEW_S = 600


def _clock(text: str, zone: Optional[str] = None) -> Optional[float]:
    """Slurm's stamp ('2026-12-04T02:55:02', the local time; with ``zone`` 'Z' or '+01:00', rfc5424's) as a Unix
    time; None for one that is not a time."""
    try:
        if zone:
            offset = 0 if zone == "Z" else (1 if zone[0] == "+" else -1) * (int(zone[1:3]) * 3600 + int(zone[-2:]) * 60)
            return calendar.timegm(time.strptime(text, "%Y-%m-%dT%H:%M:%S")) - offset
        return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))
    except (ValueError, OverflowError):
        return None
