"""What srun and torchrun themselves say about an attempt that failed (their own lines, not the program's): srun's
task and node failures in its stderr, torchrun's root-cause report, libstdc++'s last words. Pure over text; log
text is data (bounded, printable)."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Iterable, List, Optional, Sequence, Tuple

from ..datafiles import read_tail
from ..rollcall import printable
from . import logscan

# srun: "srun: error: node2: tasks 2-3: Killed", "srun: error: node1: task 0: Exited with exit code 1",
# "srun: error: Node failure on node2" (slurm/src/srun/.../step_launch.c and srun_job.c).
SRUN_TASKS = re.compile(r"^srun: error: ([A-Za-z0-9._-]+): tasks? ([0-9,-]+): (.+)$")
SRUN_NODE_FAIL = re.compile(r"^srun: error: Node failure on ([A-Za-z0-9._-]+)")
# What srun (and the shell) call the signals that end a process. Terminated (SIGTERM) is what ending a step sends
# to the tasks that are left: collateral, never a cause.
SIGNAL_WORDS = ("Killed", "Segmentation fault", "Bus error", "Aborted", "Illegal instruction", "Floating point",
                "Hangup", "Broken pipe", "Trace/breakpoint trap")
# Signals a process gets from its own instructions (a bad pointer, a bad opcode): never a sign that the node went
# away, and when one comes back in place it is the program's.
SYNCHRONOUS = ("Segmentation fault", "Bus error", "Illegal instruction", "Floating point", "Trace/breakpoint trap")
# torchrun's negative exit codes by signal, and the names srun gives them.
BY_SIGNUM = {-1: "Hangup", -4: "Illegal instruction", -5: "Trace/breakpoint trap", -6: "Aborted", -7: "Bus error",
             -8: "Floating point", -9: "Killed", -11: "Segmentation fault", -13: "Broken pipe"}
# Slurm's own words for a task the kernel's OOM killer ended (srun: "task 2: Out Of Memory"; slurmstepd: "Detected 1
# oom_kill event in StepId=...").
OOM = re.compile(r"^srun: error: ([A-Za-z0-9._-]+): tasks? ([0-9,-]+): Out Of Memory")
OOM_STEP = re.compile(r"^(?:slurmstepd|srun): error: Detected (\d{1,9}) oom[-_]kill event")
# slurmstepd's words when it ends a step over its memory limit itself (JobAcctGatherParams=OverMemoryKill, where a
# site polls memory rather than confine it by cgroup), written to the stderr of the node's first task, the numbers
# in bytes: "[2026-12-04T02:52:29.220] error: StepId=2.0 exceeded memory limit (1809863680 > 1572864000), being
# killed" (src/slurmd/common/jobacct_gather: "%ps exceeded memory limit"; 22.05 and 26.05 alike).
# The stamp is Slurm's LogTimeFormat: iso8601 (the default, the node's local time) or rfc5424/rfc3339 (with its zone).
OVER_MEMORY = re.compile(r"^(?:\[(?P<when>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.\d{1,6})?(?P<zone>Z|[+-]\d\d:?\d\d)?\] )?"
                         r"(?:slurmstepd: )?error: (?:StepId=|JobId=|Step |Job )(?P<job>\d{1,12})(?:\.[a-z0-9]{1,12})? "
                         r"exceeded memory limit \((?P<used>\d{1,20}) > (?P<limit>\d{1,20})\), being killed")
# torchrun's "Root Cause (first observed failure)" block (torch/distributed/elastic/multiprocessing/errors).
_ROOT = re.compile(r"^\s*(time|host|rank|exitcode|traceback)\s*: (.*)$")
_MAX_LOG = 1 << 22  # a batch log read for srun lines: its last 4 MiB
# libstdc++'s last words before abort(): a C++ exception nothing caught, or std::terminate (native threads left
# running at exit, as in a script that never destroys its process group). The program's own native code: it would
# end the same way on any node. Not when the exception is torch's distributed error: a watchdog thread that lost a
# peer (collateral of another rank's fault).
TERMINATE = re.compile(r"terminate called (after throwing an instance of '[^']{1,200}'|without an active "
                       r"exception|recursively)")
COLLATERAL = re.compile(r"DistBackendError|DistNetworkError|c10d|NCCL|Gloo", re.IGNORECASE)



def split_lines(text: str) -> List[str]:
    """Lines as a log has them: ended by "\n" only. str.splitlines() also ends one at "\r", "\x0b", "\x0c",
    "\x1c"-"\x1e", "\x85" and "\u2028", so a rank that printed "\rRoot Cause" would start a line of its own,
    without the launcher's prefix that marks it as the program's."""
    if not text:
        return []
    return [line.removesuffix("\r") for line in text.split("\n")][:-1 if text.endswith("\n") else None]


def tail(path: Path, limit: int = _MAX_LOG) -> List[str]:
    """The last ``limit`` bytes of a log as lines: a regular file, never through a link (logs are data)."""
    raw = read_tail(path, limit)
    return [] if raw is None else split_lines(raw.decode("utf-8", "replace"))


def short(host: str, nodes: Sequence[str]) -> str:
    """torchrun's host is the FQDN; Slurm names the node by its short name."""
    short = host.split(".", 1)[0]
    return short if short in nodes or not nodes else (host if host in nodes else short)


def srun_first(lines: Iterable[str]) -> Optional[Tuple[str, str, str]]:
    """The first failure srun saw, as (node, tasks, what): lines come in the order srun learned of them."""
    for line in lines:
        m = SRUN_NODE_FAIL.match(line)
        if m:
            return m.group(1), "", "node failure"
        m = SRUN_TASKS.match(line)
        if m and not m.group(3).startswith("Terminated"):
            return m.group(1), m.group(2), m.group(3).strip()
    return None


def srun_first_signal(lines: Iterable[str]) -> Optional[Tuple[str, str, str]]:
    """The first task srun saw end by a signal before it began ending the step itself, as (node, tasks, what); or
    after it began, an abort (srun ends tasks with SIGTERM and SIGKILL, never SIGABRT: an abort is the task's own)."""
    ending = False
    for line in lines:
        if line.startswith("srun: Terminating") or line.startswith("srun: Force Terminated"):
            ending = True
            continue
        m = SRUN_TASKS.match(line)
        if m and any(m.group(3).startswith(w) for w in (("Aborted",) if ending else SIGNAL_WORDS)):
            return m.group(1), m.group(2), m.group(3).strip()
    return None


def srun_node_failure(lines: Iterable[str]) -> Optional[str]:
    """The first node srun says Slurm lost ("Node failure on X"), wherever in its messages: Slurm's own word."""
    for line in lines:
        m = SRUN_NODE_FAIL.match(line)
        if m:
            return m.group(1)
    return None


def srun_said(lines: Iterable[str], node: str) -> str:
    """The first line srun wrote about ``node`` (its tasks' end, or a node failure): the evidence to cite."""
    for line in lines:
        m = SRUN_TASKS.match(line) or SRUN_NODE_FAIL.match(line)
        if m and m.group(1) == node:
            return line
    return ""


def signalled_on(lines: Sequence[str], node: str, word: str) -> List[int]:
    """Every task srun saw ``node`` lose to the signal ``word`` before srun began ending the step (one line or
    several). After "srun: Terminating StepId=..." the rest are srun's own doing: tasks slow to leave on SIGTERM
    are killed then ("task 2: Killed"), collateral that must not make one lost rank look like a lost node."""
    tasks: List[int] = []
    for line in lines:
        if line.startswith("srun: Terminating") or line.startswith("srun: Force Terminated"):
            break
        m = SRUN_TASKS.match(line)
        if m and m.group(1) == node and m.group(3).startswith(word):
            tasks.extend(expand(m.group(2)))
    return sorted(set(tasks))


def torchrun_roots(paths: Iterable[Path]) -> List[dict]:
    """Every torchrun agent's root cause ({time, host, rank, exitcode, traceback, log, failed}), earliest first;
    ``failed``: the exit codes of every worker of that agent its report lists. Only torchrun's own block counts: a
    rank's lines carry torchrun's prefix ("[default0]:"), so a "Root Cause" the program prints is not one."""
    found = []
    for path in paths:
        lines = tail(path)
        for i, line in enumerate(lines):
            if "Root Cause (first observed failure):" not in line or line.startswith("[default"):
                continue
            root: dict = {"log": path.name}
            for follow in lines[i + 1:i + 12]:
                m = _ROOT.match(re.sub(r"^\[[^\]]*\]:?\s?", "", follow) if follow.startswith("[") else follow)
                if m:
                    root.setdefault(m.group(1), m.group(2).strip())
            report = lines[max(0, i - 80):i + 12]
            head = max((j for j, t in enumerate(report) if t.strip() == "Failures:"), default=0)
            root["failed"] = [int(m.group(1)) for t in report[head:]
                              if (m := re.match(r"^\s*exitcode\s*: (-?\d{1,4})", t))]
            found.append(root)
    return sorted(found, key=lambda r: r.get("time", ""))


def terminate_words(log: Optional[Path]) -> Optional[Tuple[str, bool]]:
    """(libstdc++'s "terminate called ..." words, whether torch's distributed watchdog said them) or None."""
    if log is None:
        return None
    for line in tail(log, 1 << 20):
        m = TERMINATE.search(line)
        if m:
            return printable(m.group(0))[:200], bool(COLLATERAL.search(line))
    return None


def exitcode(root: dict) -> Optional[int]:
    m = re.match(r"-?\d+", root.get("exitcode", ""))
    return int(m.group()) if m else None


def srun_is_first_for(primary: Sequence[logscan.Traceback], tasks: str) -> bool:
    """A traceback exists, but the first task srun saw end was killed by a signal: the traceback is the other
    tasks' (they raised once their peer was gone), unless it is one of the killed tasks' own."""
    killed = set(expand(tasks))
    own = {int(m.group(1)) for t in primary if (m := re.match(r"rank[- ](\d+)", t.label))}
    return not (own & killed)


def killed_tasks(lines: Iterable[str]) -> dict:
    """Every task srun says was killed (SIGKILL), with its node: {rank: node}."""
    killed: dict = {}
    for line in lines:
        m = SRUN_TASKS.match(line)
        if m and m.group(3).startswith("Killed"):
            for task in expand(m.group(2)):
                killed.setdefault(task, m.group(1))
    return killed


def expand(ranges: str) -> List[int]:
    """srun's '2-3,7' -> [2, 3, 7], bounded (log text is data: '0-999999999' is not a job's)."""
    out: List[int] = []
    for part in ranges.split(",")[:1024]:
        lo, _, hi = part.partition("-")
        if lo.isdigit() and (not hi or hi.isdigit()):
            out.extend(range(int(lo), min(int(hi or lo), int(lo) + (1 << 17)) + 1))
        if len(out) > 1 << 17:
            break
    return out
