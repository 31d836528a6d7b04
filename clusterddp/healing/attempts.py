"""A job's attempts, as its batch script recorded them (``attempts.tsv`` in the run directory, one line per attempt
that ended: nodes, start, end, exit code, fault class, node(s) at fault, what came next). Read as data: the file
is the job's, but its text came from logs (bounded, printable, checked names). Login side; pure over files."""
from __future__ import annotations

import re
import time
from pathlib import Path
from typing import List, NamedTuple, Optional, Sequence, Tuple

from .. import contract
from ..datafiles import read_bounded
from ..hostlist import is_node_name
from ..rollcall import printable
from .faults import FaultKind

_MAX_LINES = 1000


class Attempt(NamedTuple):
    restart: int
    attempt: int
    start: int
    end: int
    nodes: Tuple[str, ...]
    exit: int
    fault: str                 # a FaultKind, or "" (none: it ended well or was stopped)
    fault_nodes: Tuple[str, ...]
    why: str
    next: str                  # one of contract.NEXTS
    evidence: str = ""         # what decided the fault: a file of the run directory and its line

    def line(self) -> str:
        """One line for people: 'attempt 1 (restart 0) on node1,node2, 19:40:01-19:40:17 (16 s), exit 143: ...'."""
        span = f"{_clock(self.start)}-{_clock(self.end)} ({max(0, self.end - self.start)} s)"
        head = f"attempt {self.attempt + 1} (restart {self.restart}) on {','.join(self.nodes) or '?'}, {span}, " \
               f"exit {self.exit}"
        if self.fault:
            at = f" on {','.join(self.fault_nodes)}" if self.fault_nodes else ""
            head += f": fault: {self.fault}{at}: {self.why}"
        elif self.why:
            head += f" ({self.why})"
        if self.evidence:
            head += f"; evidence: {self.evidence}"
        then = {contract.NEXT_RETRY: "retried here without the node(s) at fault",
                contract.NEXT_IN_PLACE: "retried in place on the same nodes (none excluded or quarantined)",
                contract.NEXT_REQUEUE: "requeued" + (" without the node(s) at fault" if self.fault else "")}
        return head + (f"; {then[self.next]}" if self.next in then else "")


def _nodes(text: str) -> Tuple[str, ...]:
    return tuple(n for n in text.split(",")[:4096] if is_node_name(n))


def _int(text: str) -> int:
    """A count or a Unix time: ASCII digits only ('²'.isdigit() is true and int('²') fails), at most 11 of them
    (a time past the year 5000 is not a job's, and time.localtime refuses some)."""
    return int(text) if re.fullmatch(r"[0-9]{1,11}", text) else 0


def _clock(t: int) -> str:
    try:
        return time.strftime("%H:%M:%S", time.localtime(t))
    except (OverflowError, OSError, ValueError):
        return "?"


def read(run_dir: Path) -> List[Attempt]:
    """Every attempt recorded in ``run_dir`` (none when the file is missing, a link or unreadable)."""
    raw = read_bounded(Path(run_dir) / contract.ATTEMPTS_FILE)
    if raw is None:
        return []
    out = []
    for line in raw.decode("utf-8", "replace").split("\n")[:_MAX_LINES]:
        f = line.split("\t")
        if len(f) == len(contract.ATTEMPT_FIELDS) - 1:  # (a record from before the evidence column)
            f.append("")
        if len(f) != len(contract.ATTEMPT_FIELDS):
            continue
        fault = f[6] if f[6] in tuple(FaultKind) else ""
        out.append(Attempt(_int(f[0]), _int(f[1]), _int(f[2]), _int(f[3]), _nodes(f[4]),
                           int(f[5]) if re.fullmatch(r"-?\d{1,4}", f[5]) else -1, fault, _nodes(f[7]),
                           printable(f[8])[:300], f[9] if f[9] in contract.NEXTS else "", printable(f[10])[:300]))
    return out


def append(run_dir: Path, a: Attempt) -> None:
    """Record one attempt as the batch script does (the local backend's retry loop)."""
    fields = (a.restart, a.attempt, a.start, a.end, ",".join(a.nodes), a.exit, a.fault, ",".join(a.fault_nodes),
              re.sub(r"[\t\r\n]+", " ", a.why), a.next, re.sub(r"[\t\r\n]+", " ", a.evidence))
    with open(Path(run_dir) / contract.ATTEMPTS_FILE, "a", encoding="utf-8") as fh:
        fh.write("\t".join(str(f) for f in fields) + "\n")


class Allocation(NamedTuple):
    """One allocation the job held (a requeue gets a new one): when it began and ended (0: not recorded), and its
    nodes, spares and excluded ones included."""

    restart: int
    start: float
    end: float
    nodes: Tuple[str, ...]


def _time(text: str) -> float:
    return float(text) if re.fullmatch(r"[0-9]{1,11}(\.[0-9]{1,9})?", text) else 0.0


def began(run_dir: Path, restart: int, when: float, hosts: Sequence[str]) -> None:
    """Record that this restart's allocation began at ``when`` on ``hosts`` (the batch script's EXIT trap records
    its end)."""
    with open(Path(run_dir) / contract.ALLOCATIONS_FILE, "a", encoding="utf-8") as fh:
        fh.write(f"begin\t{restart}\t{when:.3f}\t{','.join(hosts)}\n")


def ended(run_dir: Path, restart: int, when: float) -> None:
    """Record the end of this restart's allocation (the local backend; a batch script's EXIT trap writes the same)."""
    with open(Path(run_dir) / contract.ALLOCATIONS_FILE, "a", encoding="utf-8") as fh:
        fh.write(f"end\t{restart}\t{when:.3f}\n")


def allocations(run_dir: Path) -> List[Allocation]:
    """Every allocation recorded, by restart (the first begin and the last end of each)."""
    raw = read_bounded(Path(run_dir) / contract.ALLOCATIONS_FILE)
    found: dict = {}
    for line in (raw or b"").decode("utf-8", "replace").split("\n")[:_MAX_LINES]:
        f = line.split("\t")
        if len(f) == 4 and f[0] == "begin" and _time(f[2]) and _int(f[1]) not in found:
            found[_int(f[1])] = Allocation(_int(f[1]), _time(f[2]), 0.0, _nodes(f[3]))
        elif len(f) == 3 and f[0] == "end" and _int(f[1]) in found and _time(f[2]):
            found[_int(f[1])] = found[_int(f[1])]._replace(end=_time(f[2]))
    return [found[r] for r in sorted(found)]


def set_aside(run_dir: Path, restart: int, attempt: int) -> Path:
    """A failed attempt's logs and reports moved to attempts/RESTART.ATTEMPT/ (a fresh directory: one left there
    before is never merged into)."""
    run = Path(run_dir)
    to = base = run / contract.ATTEMPT_DIR.format(restarts=restart, attempt=attempt)
    n = 0
    while to.exists() or to.is_symlink():
        n += 1
        to = base.with_name(f"{base.name}-{n}")
    to.mkdir(parents=True)
    for path in sorted(run.glob("rank-*.out")) + sorted(run.glob("node-*.out")) + [run / "stacks", run / "torchrun",
                                                                                       run / "telemetry"]:
        if path.exists() and not path.is_symlink():
            path.rename(to / path.name)
    return to


def set_aside_logs(run_dir: Path, restart: int) -> Optional[Path]:
    """At a requeued job's start: the logs of its last restart moved to attempts/RESTART.end/ (srun appends a
    requeued job's output to its files, so a rank's log would mix two restarts); None when there were none."""
    run = Path(run_dir)
    logs = [p for p in sorted(run.glob("rank-*.out")) + sorted(run.glob("node-*.out")) if not p.is_symlink()]
    if not logs:
        return None
    to = base = run / contract.ATTEMPT_DIR.format(restarts=restart, attempt="end")
    n = 0
    while to.exists() or to.is_symlink():
        n += 1
        to = base.with_name(f"{base.name}-{n}")
    to.mkdir(parents=True)
    for path in logs:
        path.rename(to / path.name)
    return to


def at_fault(attempts: Sequence[Attempt]) -> List[Tuple[Tuple[str, ...], str]]:
    """(nodes, why) of every attempt that ended in a node fault with its node(s) known (why: with its evidence, for
    `clusterddp nodes`)."""
    return [(a.fault_nodes, a.why + (f"; evidence: {a.evidence}" if a.evidence else "")) for a in attempts
            if a.fault == FaultKind.INFRASTRUCTURE and a.fault_nodes and a.next != contract.NEXT_IN_PLACE]


def starts(run_dir: Path) -> List[dict]:
    """Where each attempt's ranks started (rank 0's records, contract.RECOVERY_FILE), as checked data."""
    import json

    raw = read_bounded(Path(run_dir) / contract.RECOVERY_FILE)
    out = []
    for line in (raw or b"").decode("utf-8", "replace").split("\n")[:_MAX_LINES]:
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if not isinstance(r, dict) or r.get("how") not in ("peer", "checkpoint", "fresh") \
                or not isinstance(r.get("time"), (int, float)) or not isinstance(r.get("restart"), int):
            continue
        step = r.get("step") if isinstance(r.get("step"), int) and not isinstance(r.get("step"), bool) else None
        nodes = _nodes(",".join(n for n in r.get("nodes") or [] if isinstance(n, str)))
        why = printable(r["why"])[:300] if isinstance(r.get("why"), str) else ""
        out.append({"time": float(r["time"]), "restart": r["restart"], "how": r["how"], "step": step,
                    "nodes": nodes, "why": why})
    return out


def lines(run_dir: Path, found: Sequence[Attempt]) -> List[str]:
    """Each attempt's line, and after a fault, where the next one started (issue 55: the survivors' memory, or the
    checkpoint and why not the survivors')."""
    records = starts(run_dir)
    out = []
    for a in found:
        text = a.line()
        rec = next((r for r in records if r["restart"] == a.restart and a.start - 1 <= r["time"] <= a.end + 1), None)
        if rec and (a.attempt or a.restart) and rec["how"] == "peer":
            text += (f"; started from the survivors' memory at step {rec['step']} (peer heal: "
                     f"{','.join(rec['nodes']) or '?'}; no checkpoint read)")
        elif rec and (a.attempt or a.restart) and rec["how"] == "checkpoint":
            text += f"; started from the checkpoint of step {rec['step']}" + (
                f" (peer heal not used: {rec['why']})" if rec["why"] else "")
        out.append(text)
    return out
