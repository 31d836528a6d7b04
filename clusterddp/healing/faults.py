"""Was it the program or a node? The first failure of a job that ended, from what it left behind (the batch log's
srun lines, torchrun's root-cause reports, the ranks' tracebacks, the hang watchdog's roll call, the rendezvous
report), classified once:

- **infrastructure**: a rank or node killed by a signal with no Python traceback of its own, srun reporting a node
  failure, the hang watchdog (79), a rendezvous that missed ranks (78), a transport error as the first failure;
  with the node(s) at fault where they are known;
- **program**: a Python exception as the first failure (it would fail again on any node).

Collateral errors of the other ranks ("connection closed by peer" after a peer died, srun ending the rest with
SIGTERM) are never the cause. Pure over text and the run directory; log text is data (bounded, printable).
"""
from __future__ import annotations

import re
import sys
from enum import Enum
from pathlib import Path
from typing import Iterable, List, NamedTuple, Optional, Sequence, Tuple

from ..datafiles import read_json, read_tail
from ..hostlist import is_node_name
from ..rollcall import hang_report, printable, read_hellos, rendezvous_failure
from . import logscan


class FaultKind(str, Enum):
    """Whose fault a failed attempt was, as the batch script and attempts.tsv write it."""

    INFRASTRUCTURE = "infrastructure"  # a node or the network: retried without the node
    PROGRAM = "program"                # the program itself: never retried
    UNKNOWN = "unknown"                # nothing the job left tells one from the other

    __str__ = str.__str__              # written as the word, not FaultKind.X
    __format__ = str.__format__        # type: ignore[assignment]
    __hash__ = str.__hash__          # in a set or dict, the same key as the word


INFRASTRUCTURE = FaultKind.INFRASTRUCTURE
PROGRAM = FaultKind.PROGRAM

# srun: "srun: error: node2: tasks 2-3: Killed", "srun: error: node1: task 0: Exited with exit code 1",
# "srun: error: Node failure on node2" (slurm/src/srun/.../step_launch.c and srun_job.c).
_SRUN_TASKS = re.compile(r"^srun: error: ([A-Za-z0-9._-]+): tasks? ([0-9,-]+): (.+)$")
_SRUN_NODE_FAIL = re.compile(r"^srun: error: Node failure on ([A-Za-z0-9._-]+)")
# What srun (and the shell) call the signals that end a process. Terminated (SIGTERM) is what ending a step sends
# to the tasks that are left: collateral, never a cause.
_SIGNAL_WORDS = ("Killed", "Segmentation fault", "Bus error", "Aborted", "Illegal instruction", "Floating point",
                 "Hangup", "Broken pipe", "Trace/breakpoint trap")
# torchrun's "Root Cause (first observed failure)" block (torch/distributed/elastic/multiprocessing/errors).
_ROOT = re.compile(r"^\s*(time|host|rank|exitcode|traceback)\s*: (.*)$")
_MAX_LOG = 1 << 22  # a batch log read for srun lines: its last 4 MiB
# libstdc++'s last words before abort(): a C++ exception nothing caught, or std::terminate (native threads left
# running at exit, as in a script that never destroys its process group). The program's own native code: it would
# end the same way on any node. Not when the exception is torch's distributed error: a watchdog thread that lost a
# peer (collateral of another rank's fault).
_TERMINATE = re.compile(r"terminate called (after throwing an instance of '[^']{1,200}'|without an active "
                        r"exception|recursively)")
_COLLATERAL_TERMINATE = re.compile(r"DistBackendError|DistNetworkError|c10d|NCCL|Gloo", re.IGNORECASE)


class Fault(NamedTuple):
    kind: FaultKind
    nodes: Tuple[str, ...]    # the node(s) at fault, where known (infrastructure)
    why: str                  # one line for people

    def line(self) -> str:
        at = f" on {','.join(self.nodes)}" if self.nodes else ""
        what = "a node or the network, not the program" if self.kind == INFRASTRUCTURE else "the program"
        return f"fault: {self.kind}{at}: {self.why} ({what})"


def _tail(path: Path, limit: int = _MAX_LOG) -> List[str]:
    """The last ``limit`` bytes of a log as lines: a regular file, never through a link (logs are data)."""
    raw = read_tail(path, limit)
    return [] if raw is None else raw.decode("utf-8", "replace").splitlines()


def _short(host: str, nodes: Sequence[str]) -> str:
    """torchrun's host is the FQDN; Slurm names the node by its short name."""
    short = host.split(".", 1)[0]
    return short if short in nodes or not nodes else (host if host in nodes else short)


def srun_first(lines: Iterable[str]) -> Optional[Tuple[str, str, str]]:
    """The first failure srun saw, as (node, tasks, what): lines come in the order srun learned of them."""
    for line in lines:
        m = _SRUN_NODE_FAIL.match(line)
        if m:
            return m.group(1), "", "node failure"
        m = _SRUN_TASKS.match(line)
        if m and not m.group(3).startswith("Terminated"):
            return m.group(1), m.group(2), m.group(3).strip()
    return None


def torchrun_roots(paths: Iterable[Path]) -> List[dict]:
    """Every torchrun agent's root cause ({time, host, rank, exitcode, traceback}), earliest first."""
    found = []
    for path in paths:
        lines = _tail(path)
        for i, line in enumerate(lines):
            if "Root Cause (first observed failure):" not in line:
                continue
            root: dict = {"log": path.name}
            for follow in lines[i + 1:i + 12]:
                m = _ROOT.match(re.sub(r"^\[[^\]]*\]:?\s?", "", follow) if follow.startswith("[") else follow)
                if m:
                    root.setdefault(m.group(1), m.group(2).strip())
            found.append(root)
    return sorted(found, key=lambda r: r.get("time", ""))


def terminated(log: Path) -> Optional[str]:
    """libstdc++'s "terminate called ..." line in a rank's (or node's) log, when it is not collateral."""
    for line in _tail(log, 1 << 20):
        m = _TERMINATE.search(line)
        if m and not _COLLATERAL_TERMINATE.search(line):
            return printable(m.group(0))[:200]
    return None


def native_abort(log: Optional[Path]) -> Optional[Fault]:
    """A program fault when ``log`` (of the rank, or node, that failed first) ends in libstdc++'s abort."""
    said = terminated(log) if log is not None else None
    return None if said is None else Fault(PROGRAM, (), printable(
        f"{log.name if log else ''}: {said}: the program's native code ended it (abort), as it would on any node"))


def _exitcode(root: dict) -> Optional[int]:
    m = re.match(r"-?\d+", root.get("exitcode", ""))
    return int(m.group()) if m else None


def classify(run_dir: Path, logs: Sequence[Path], batch_log: Optional[Path], nodes: Sequence[str] = (),
             node_failed: bool = False) -> Optional[Fault]:
    """The fault class of a job that failed, or None when nothing tells (then it is reported as today).
    ``nodes``: the job's node names (to map torchrun's host names); ``node_failed``: Slurm said NODE_FAIL."""
    run_dir = Path(run_dir)
    hang = hang_report(run_dir)
    if hang is not None:
        call = read_json(Path(hang["dir"]) / "rollcall.json")
        groups = call.get("groups") if isinstance(call, dict) else None
        odd: List[str] = []
        if isinstance(groups, list) and len(groups) > 1:
            odd = sorted({str(n) for g in groups[1:] if isinstance(g, dict) for n in g.get("nodes", [])})
        return Fault(INFRASTRUCTURE, _clean(odd), f"the hang watchdog ended the job ({hang['summary']})")
    rendezvous = rendezvous_failure(run_dir)
    if rendezvous is not None:
        hellos = read_hellos(run_dir)
        seen = {str(h.get("node")) for h in hellos.values()}
        absent = tuple(n for n in nodes if n not in seen) if hellos else ()
        return Fault(INFRASTRUCTURE, _clean(absent), rendezvous)
    found = logscan.tracebacks(list(logs))
    primary = [t for t in found if not t.secondary]
    first = srun_first(_tail(batch_log)) if batch_log is not None else None
    roots = torchrun_roots(logs)
    if roots:
        # torchrun's times are whole seconds: a failure and its collateral can share one, and then the signal is
        # the cause (the collateral comes after it).
        tied = [r for r in roots if r.get("time", "") == roots[0].get("time", "")]
        signalled = [r for r in tied if (_exitcode(r) or 0) < 0 and _exitcode(r) != -15]
        if signalled:
            root = signalled[0]
            by_name = {path.name: path for path in logs}
            native = native_abort(by_name.get(root.get("log", ""))) if _exitcode(root) == -6 else None
            if native is not None:
                return native
            hosts = [_short(r.get("host", ""), nodes) for r in signalled]
            return Fault(INFRASTRUCTURE, _clean(hosts), printable(
                f"rank {root.get('rank', '?').split()[0]} on {hosts[0]} ended by {root.get('traceback', 'a signal')}, "
                "no Python traceback"))
    if first is not None and first[2] != "node failure" and any(first[2].startswith(w) for w in _SIGNAL_WORDS):
        node, tasks, what = first
        if what.startswith("Aborted"):
            by_name = {path.name: path for path in logs}
            for task in _expand(tasks):
                native = native_abort(by_name.get(f"rank-{task}.out"))
                if native is not None:
                    return native
        if not primary or srun_is_first_for(primary, tasks):
            return Fault(INFRASTRUCTURE, _clean([node]),
                         printable(f"rank(s) {tasks} on {node}: {what.lower()} (a signal, no Python traceback)"))
    if first is not None and first[2] == "node failure" or node_failed:
        node = first[0] if first is not None else ""
        return Fault(INFRASTRUCTURE, _clean([node] if node else []), "Slurm reported a node failure")
    if primary:
        return Fault(PROGRAM, (), printable(f"{primary[0].label}: {primary[0].last[:200]}"))
    if found:  # only collateral errors: a peer vanished without saying why
        return Fault(INFRASTRUCTURE, (), printable(f"only errors of a lost peer ({found[0].last[:160]})"))
    return None


def hang_place(call: object) -> str:
    """Where a hang's odd ones out wait (else everyone): the innermost frame as FILE:LINE, or ''."""
    groups = call.get("groups") if isinstance(call, dict) else None
    if not isinstance(groups, list) or not groups:
        return ""
    group = groups[1] if len(groups) > 1 else groups[0]
    frames = group.get("frames") if isinstance(group, dict) else None
    return printable(str(frames[0]))[:200] if isinstance(frames, list) and frames else ""


def attempt(run_dir: Path, step_err: Path, nodes: Sequence[str]) -> Fault:
    """The fault of one failed attempt of the batch script's retry loop (the run directory holds only this
    attempt's logs and reports; earlier attempts' are under attempts/). A hang at the place where an earlier
    attempt hung is the program's, not a node's."""
    run_dir = Path(run_dir)
    logs = sorted(run_dir.glob("rank-*.out")) + sorted(run_dir.glob("node-*.out"))
    fault = classify(run_dir, logs, step_err, nodes)
    if fault is None:
        return Fault(FaultKind.UNKNOWN, (), "nothing the job left tells a node fault from a program fault")
    hang = hang_report(run_dir)
    if hang is not None and fault.kind == INFRASTRUCTURE:
        place = hang_place(read_json(Path(hang["dir"]) / "rollcall.json"))
        earlier = {hang_place(read_json(p)) for p in run_dir.glob("attempts/*/stacks/hang-*/rollcall.json")}
        if place and place in earlier:
            return Fault(PROGRAM, (), f"the same hang twice at {place}: probably the program, not a node")
    return fault


def main(argv: Sequence[str]) -> int:
    """``python -m clusterddp.healing.faults RUN_DIR STEP_ERR NODES``: one attempt's fault for the batch script
    (templates/base.sh.j2) as three lines: kind, the nodes at fault comma-separated (maybe empty), why. (Lines,
    not tabs: `read` merges the tabs around an empty field, tab being white space to it.)"""
    if len(argv) != 3:
        print("usage: python -m clusterddp.healing.faults RUN_DIR STEP_ERR NODE[,NODE...]", file=sys.stderr)
        return 2
    fault = attempt(Path(argv[0]), Path(argv[1]), [n for n in argv[2].split(",") if n])
    why = re.sub(r"[\t\r\n]+", " ", fault.why)
    print(f"{fault.kind}\n{','.join(fault.nodes)}\n{why}")
    return 0


def srun_is_first_for(primary: Sequence[logscan.Traceback], tasks: str) -> bool:
    """A traceback exists, but the first task srun saw end was killed by a signal: the traceback is the other
    tasks' (they raised once their peer was gone), unless it is one of the killed tasks' own."""
    killed = set(_expand(tasks))
    own = {int(m.group(1)) for t in primary if (m := re.search(r"rank-(\d+)\.out", t.label))}
    return not (own & killed)


def _expand(ranges: str) -> List[int]:
    """srun's '2-3,7' -> [2, 3, 7], bounded (log text is data: '0-999999999' is not a job's)."""
    out: List[int] = []
    for part in ranges.split(",")[:1024]:
        lo, _, hi = part.partition("-")
        if lo.isdigit() and (not hi or hi.isdigit()):
            out.extend(range(int(lo), min(int(hi or lo), int(lo) + (1 << 17)) + 1))
        if len(out) > 1 << 17:
            break
    return out


def _clean(nodes: Iterable[str]) -> Tuple[str, ...]:
    """Node names as data: only hostname characters (they may reach an #SBATCH --exclude line)."""
    return tuple(sorted({n for n in nodes if n and is_node_name(n)}))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
