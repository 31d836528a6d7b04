"""Was it the program or a node? One failed attempt's evidence, from the records it left (srun's own messages,
torchrun's root-cause reports, the runtime's hello and exception records, the hang watchdog's roll call, the
rendezvous report) and, for scripts without the runtime, the ranks' last tracebacks, classified once:

- **infrastructure** (node evidence): srun's node failure or Slurm's NODE_FAIL, every rank of one node killed at
  once, the hang watchdog's odd ones out (79), a rendezvous that missed a node's ranks (78);
- **ambiguous**: one rank ended by a signal with nothing else said (a segfault, a KILL of one rank of several):
  retried once in place (healing/supervise.py);
- **program**: a Python exception as the first failure, abort() (SIGABRT: the process ends itself; libstdc++'s
  "terminate called ..."), an out-of-memory kill (it would fail again on any node);
- **after-work**: the rank that failed had already left (its runtime's shutdown() done): the results are intact.

Collateral errors of the other ranks ("connection closed by peer" after a peer died, srun ending the rest with
SIGTERM, torch's distributed watchdog aborting) are never the cause. Pure over text and the run directory; log text
is data (bounded, printable). Text the program printed is not a record: a "Root Cause" block counts only as
torchrun's own (not a rank's prefixed line), a traceback only as the last words of its writer.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

from .. import contract
from ..datafiles import read_json
from ..rollcall import MAX_WORLD, hang_report, is_rank, printable, read_hellos, rendezvous_failure
from . import logscan
from .fault import AFTER_WORK, AMBIGUOUS, INFRASTRUCTURE, PROGRAM, SUSPECT, Fault, FaultKind, cite, clean_nodes
from .hangs import hang_fault, hang_place
from .launchers import (
    BY_SIGNUM,
    OOM,
    OOM_STEP,
    SIGNAL_WORDS,
    SYNCHRONOUS,
    exitcode,
    short,
    signalled_on,
    srun_first,
    srun_first_signal,
    srun_is_first_for,
    srun_node_failure,
    srun_said,
    tail,
    terminate_words,
    torchrun_roots,
)
from .memory import SKEW_S, out_of_memory, over_memory

__all__ = ["Fault", "FaultKind", "INFRASTRUCTURE", "SUSPECT", "AMBIGUOUS", "PROGRAM", "AFTER_WORK", "SYNCHRONOUS",
           "SKEW_S", "cite", "classify", "attempt", "after_work", "signal_fault", "recorded", "slurm_lost_node",
           "slurm_down", "hang_place", "torchrun_cause"]


def signal_fault(what: str, node: str, tasks: str, ranks: Sequence[int], logs: Sequence[Optional[Path]],
                 per_node: int = 0, lost: Optional[int] = None) -> Fault:
    """Rank(s) ``ranks`` on ``node`` ended by the signal srun calls ``what``, nothing else said first: whose fault.
    abort() is the process's own act (the program's), unless torch's distributed watchdog aborted it (collateral of
    a lost peer: never the cause); a fault of the rank's own instructions (a segfault) and a single rank killed
    (whatever the ranks per node: the kernel's OOM killer ends one process) are ambiguous; two or more ranks, every
    one of the node's, killed at once, with nothing from Slurm, make the node a suspect. ``lost``: how many of the
    node's ranks the signal ended (default: ``ranks``); ``per_node`` 0: not known."""
    word = next((w for w in SIGNAL_WORDS if what.startswith(w)), what)
    at = printable(f"rank(s) {tasks} on {node}: {what.lower()}")
    ranks, nodes = tuple(ranks[:64]), clean_nodes([node])
    if word == "Aborted":
        for log in logs:
            said = terminate_words(log)
            if said is not None and said[1]:
                return Fault(AMBIGUOUS, (), f"{at}: torch's distributed watchdog gave up ({said[0]}): a peer was "
                             "lost, which one is not known (the waiting rank is never the cause)", word, ranks)
            if said is not None:
                return Fault(PROGRAM, (), printable(f"{log.name if log else ''}: {said[0]}: the program's native code "
                                                    "ended it (abort), as it would on any node"), word, ranks)
        return Fault(PROGRAM, (), f"{at} (SIGABRT: the process ended itself with abort(), an assertion or a native "
                                  "library's, as it would on any node)", word, ranks)
    if word in SYNCHRONOUS:
        return Fault(AMBIGUOUS, nodes, f"{at} (a fault of the rank's own instructions: the program's code or the "
                                       "node's hardware)", word, ranks)
    lost = len(ranks) if lost is None else lost
    if lost < 2 or (per_node and lost < per_node):
        of = f" of the node's {per_node} ranks" if per_node else " rank(s)"
        return Fault(AMBIGUOUS, nodes, f"{at} ({lost}{of}, nothing else said: one process killed, as the "
                                       "kernel's OOM killer does, is not a node lost)", word, ranks)
    return Fault(SUSPECT, nodes, f"{at} (every one of its {lost} ranks at once, no Python traceback, nothing from "
                                 "Slurm)", word, ranks)


def torchrun_cause(roots: Sequence[dict], by_name: dict, primary: bool = True) -> Optional[dict]:
    """Of torchrun's root causes (earliest first), the one a signal ended that is the cause, or None. Their times are
    whole seconds: a failure and its collateral can share one, and then the signal is the cause (the collateral
    comes after it). Where no rank's error is a cause of its own (``primary`` False), the earliest signal is the
    cause even after a peer's reaction (an agent's root cause's time is when it looked, and a loaded machine's
    killed workers' agent can look last), an abort by torch's distributed watchdog (a peer's collateral) only where
    no other signal is. ``by_name``: the logs by name."""
    def signalled(r: dict) -> bool:
        return (exitcode(r) or 0) < 0 and exitcode(r) != -15

    if primary:
        return next((r for r in roots if r.get("time", "") == roots[0].get("time", "") and signalled(r)), None)
    found = [r for r in roots if signalled(r)]
    watchdog = [r for r in found if exitcode(r) == -6 and (terminate_words(by_name.get(r.get("log", ""))) or
                                                              ("", False))[1]]
    return next((r for r in found if r not in watchdog), found[0] if found else None)


def _torchrun_fault(roots: Sequence[dict], nodes: Sequence[str], by_name: dict, per_node: int,
                    primary: bool = True) -> Optional[Fault]:
    """torchrun's root cause, when a signal ended it (torchrun_cause). A report of a host this attempt did not run
    on is an earlier one's (never this attempt's evidence)."""
    if nodes:
        roots = [r for r in roots if short(r.get("host", ""), nodes) in nodes]
    root = torchrun_cause(roots, by_name, primary)
    if root is None:
        return None
    host, rank = short(root.get("host", ""), nodes), root.get("rank", "?").split()[0]
    lost = [c for c in root.get("failed", []) if c < 0 and c != -15]
    fault = signal_fault(BY_SIGNUM.get(exitcode(root) or 0, "Killed"), host, rank,
                         [int(rank)] if rank.isdigit() else [], [by_name.get(root.get("log", ""))], per_node,
                         max(1, len(lost)))
    fault = fault._replace(evidence=cite(str(root.get("log", "")), f"torchrun's root cause: rank {rank} on {host}, "
                                         f"exitcode {root.get('exitcode', '?')}"))
    if fault.kind != SUSPECT:
        return fault
    return fault._replace(why=printable(f"rank {rank} on {host} ended by {root.get('traceback', 'a signal')}, with "
                                        f"every one of its {len(lost)} ranks, no Python traceback, nothing from "
                                        "Slurm"))


_COLLATERAL_TYPES = ("DistBackendError", "DistNetworkError", "DistStoreError", "DistError", "ChildFailedError")


def recorded(run_dir: Path, restart: Optional[int] = None) -> List[logscan.Traceback]:
    """The exceptions that ended ranks, from the runtime's records (contract.EXCEPTION_FILE; the latest restart's),
    as causes: earliest first, those that only react to a lost peer left out. A record, not text the program
    printed: where there is one, a traceback in a log is not needed to tell."""
    found = []
    for path in sorted((Path(run_dir) / contract.EXCEPTION_FILE).parent.glob("exception-*.json"))[:MAX_WORLD]:
        r = read_json(path, 1 << 16)
        if not isinstance(r, dict) or not is_rank(r.get("rank")) or path.name != f"exception-{r['rank']}.json" \
                or not is_rank(r.get("restart"), 1 << 20) or not isinstance(r.get("time"), (int, float)):
            continue
        kind, message = printable(str(r.get("type", "")))[:200], printable(str(r.get("message", "")))[:300]
        where = printable(str(r.get("user") or r.get("where") or ""))[:300]
        short = kind.rsplit(".", 1)[-1]
        secondary = short in _COLLATERAL_TYPES or any(s in message for s in logscan.SECONDARY)
        found.append((r["restart"], float(r["time"]), logscan.Traceback(
            secondary, f"rank {r['rank']}", [], f"{short}: {message}" + (f" (at {where})" if where else ""))))
    # This restart's only: a requeued job (or the drill's next run) keeps its run directory and the records in it.
    latest = restart if restart is not None else max(
        [r for r, _, _ in found] + [h["restart"] for h in read_hellos(Path(run_dir)).values()], default=0)
    return [t for r, _, t in sorted(found, key=lambda f: f[1]) if r == latest and not t.secondary]


def classify(run_dir: Path, logs: Sequence[Path], batch_log: Optional[Path], nodes: Sequence[str] = (),
             node_failed: bool = False, per_node: int = 0, job: str = "", since: float = 0,
             restart: Optional[int] = None, launcher: str = "") -> Optional[Fault]:
    """The fault class of a job that failed, or None when nothing tells (then it is reported as today).
    ``nodes``: the job's node names (to map torchrun's host names); ``node_failed``: Slurm said NODE_FAIL;
    ``per_node``: ranks per node (0: unknown); ``job`` and ``since``: the job's id and the attempt's start (Slurm's
    memory kill of this attempt only); ``restart``: the restart judged (its roll call, rendezvous report and records
    only; None: the latest); ``launcher``: srun, torchrun or spawn (torchrun's own report is read only under
    torchrun; "": as the ranks' records say)."""
    run_dir = Path(run_dir)
    hang = hang_report(run_dir, restart)
    if hang is not None:
        return hang_fault(run_dir, hang, restart)
    rendezvous = rendezvous_failure(run_dir, restart)
    if rendezvous is not None:
        hellos = read_hellos(run_dir, restart)
        seen = {str(h.get("node")) for h in hellos.values()}
        absent = tuple(n for n in nodes if n not in seen) if hellos else ()
        return Fault(INFRASTRUCTURE, clean_nodes(absent), rendezvous)
    err = tail(batch_log) if batch_log is not None else []
    name = batch_log.name if batch_log is not None else ""
    if not launcher:
        launcher = next((h["launcher"] for h in read_hellos(run_dir, restart).values() if h.get("launcher")), "")
    slurm = _slurm_said(logs, err, name, launcher, job, since, node_failed)
    if slurm is not None:
        return slurm
    found = logscan.tracebacks(list(logs))
    primary = recorded(run_dir, restart) or [t for t in found if not t.secondary]
    first = srun_first(err)
    if first is not None and not primary and not any(first[2].startswith(w) for w in SIGNAL_WORDS):
        # A peer that only reacted (its error is collateral) can exit before srun hears of the signal that was the
        # cause: the first signal srun reports before it begins ending the step is the cause then.
        first = srun_first_signal(err) or first
    by_name = {path.name: path for path in logs}
    # Under spawn (and srun) node-N.out is the program's own output: a "Root Cause" block there is its text.
    roots = torchrun_roots([path for path in logs if path.name.startswith("node-")]) if launcher == "torchrun" else []
    fault = _torchrun_fault(roots, nodes, by_name, per_node, bool(primary)) if roots else None
    if fault is not None:
        return fault
    if first is not None and first[2] != "node failure" and any(first[2].startswith(w) for w in SIGNAL_WORDS):
        node, tasks, what = first
        if not primary or srun_is_first_for(primary, tasks):
            word = next(w for w in SIGNAL_WORDS if what.startswith(w))
            ranks = signalled_on(err, node, word)
            said = srun_said(err, node)
            return signal_fault(what, node, tasks, ranks, [by_name.get(f"rank-{r}.out") for r in ranks[:16]],
                                per_node)._replace(evidence=cite(name, said) if said else "")
    if primary:
        return Fault(PROGRAM, (), printable(f"{primary[0].label}: {primary[0].last[:200]}"),
                     evidence=cite(_source(primary[0]), primary[0].last))
    if found:  # only collateral errors: a peer vanished without saying why
        return Fault(AMBIGUOUS, (), printable(f"only errors of a lost peer ({found[0].last[:160]})"),
                     evidence=cite(_source(found[0]), found[0].last))
    return None


def _slurm_said(logs: Sequence[Path], err: Sequence[str], name: str, launcher: str, job: str, since: float,
                node_failed: bool) -> Optional[Fault]:
    """What Slurm itself said of this attempt: an out-of-memory kill (the program's), a node it lost (that node's,
    wherever srun wrote it among its messages); None when it said neither."""
    oom = out_of_memory(err)
    if oom is not None:
        return oom._replace(evidence=cite(name, next(t for t in err if OOM.match(t) or OOM_STEP.match(t))))
    # slurmstepd writes its memory kill into the first task's log of the node: a rank's (srun), an agent's (torchrun,
    # spawn: node-N.out)
    over = over_memory([p for p in logs if p.name.startswith("rank-" if launcher == "srun" else ("rank-", "node-"))],
                       err, job, since)
    if over is not None:
        return over
    failed_node = srun_node_failure(err)
    if failed_node is None and not node_failed:
        return None
    node = failed_node or ""
    said = srun_said(err, node) if node else ""
    return Fault(INFRASTRUCTURE, clean_nodes([node] if node else []), "Slurm reported a node failure",
                 evidence=cite(name, said) if said else "Slurm's job state NODE_FAIL")


def _source(t: logscan.Traceback) -> str:
    """The file a traceback was read from: the runtime's record of a rank ('rank 3'), or a log ('node-0.out local
    rank 1')."""
    if t.label.startswith("rank ") and t.label[5:].isdigit():
        return contract.EXCEPTION_FILE.format(rank=t.label[5:])
    return t.label.split(" local rank", 1)[0]


def slurm_lost_node(step_err: Path) -> Optional[Fault]:
    """Slurm's own word that a node of this attempt failed ("Node failure on X" in srun's messages), as the fault of
    an attempt Slurm ended (it cancels a job whose node failed, and requeues it where it may); None without one."""
    err = tail(step_err)
    node = srun_node_failure(err)
    if node is None:
        return None
    return Fault(INFRASTRUCTURE, clean_nodes([node]), "Slurm reported a node failure",
                 evidence=cite(step_err.name, srun_said(err, node) or f"srun: error: Node failure on {node}"))


#: What sinfo's compact state (``%t``) may end with: '*' not responding, '~' '#' '!' '%' powered (or powering)
#: down, '$' '@' '^' maintenance or reboot, '-' planned.
STATE_FLAGS = "*~#!%$@^-"


def sinfo_states(lines: Iterable[str]) -> Iterator[Tuple[str, str, str]]:
    """(node, compact state, the line) of each of sinfo's ``--Node --format='%N %t'`` lines (base.sh.j2's
    clusterddp_room writes them)."""
    for line in lines:
        words = line.split()
        if len(words) == 2:
            yield words[0], words[1], line


def slurm_down(sinfo: Path, nodes: Sequence[str], since: float) -> Optional[Fault]:
    """Slurm's own state of this attempt's nodes after it ended (sinfo's ``%N %t``, written by the batch script once
    srun is gone, base.sh.j2): a node that ran this attempt and is DOWN now went down during it (Slurm ends the jobs
    of a node it sets DOWN; not a job submitted with --no-kill, whose cancel while a node is down would be read as
    that node's failure: a limit, docs/node-failure.md). Asked only where Slurm's SIGTERM ended the attempt and
    srun's messages lack Slurm's word (srun can be ended before it writes it). A file older than the attempt is not
    this attempt's; not responding alone (``idle*``), drain and fail end no job: not evidence here. None without a
    down node."""
    try:
        if sinfo.is_symlink() or not sinfo.is_file() or sinfo.stat().st_mtime < since:
            return None
    except OSError:
        return None
    down: Dict[str, str] = {}
    for node, state, line in sinfo_states(tail(sinfo)):
        if node in nodes and state.rstrip(STATE_FLAGS) == "down":
            down.setdefault(node, line)
    if not down:
        return None
    first = sorted(down)[0]
    return Fault(INFRASTRUCTURE, clean_nodes(down), "Slurm reported a node failure",
                 evidence=cite(contract.SINFO_FILE, down[first]))


def attempt(run_dir: Path, step_err: Path, nodes: Sequence[str], per_node: int = 0, job: str = "",
            since: float = 0, restart: Optional[int] = None, launcher: str = "") -> Fault:
    """The fault of one failed attempt of the batch script's retry loop (the run directory holds only this
    attempt's logs and reports; earlier attempts' are under attempts/, earlier restarts' records are told apart by
    their restart). A hang at the place where an earlier attempt hung is the program's, whatever the roll call
    said; a rank that failed after its runtime's shutdown() ended is after-work."""
    run_dir = Path(run_dir)
    logs = sorted(run_dir.glob("rank-*.out")) + sorted(run_dir.glob("node-*.out"))
    fault = classify(run_dir, logs, step_err, nodes, per_node=per_node, job=job, since=since, restart=restart,
                     launcher=launcher)
    if fault is None:
        return Fault(FaultKind.UNKNOWN, (), "nothing the job left tells a node fault from a program fault")
    hang = hang_report(run_dir, restart)
    if hang is not None:
        place = hang_place(read_json(Path(hang["dir"]) / "rollcall.json"))
        earlier = {hang_place(read_json(p)) for p in run_dir.glob("attempts/*/stacks/hang-*/rollcall.json")}
        if place and place in earlier:
            return Fault(PROGRAM, (), f"the same hang twice at {place}: probably the program, not a node",
                         evidence=fault.evidence)
    return after_work(run_dir, fault)


def after_work(run_dir: Path, fault: Fault) -> Fault:
    """``fault`` as after-work when every rank it names had left (the runtime's shutdown() done, its hello record
    says so) before it failed: the job's results are intact, nothing to retry."""
    if not fault.ranks or fault.kind == FaultKind.UNKNOWN:
        return fault
    hellos = read_hellos(Path(run_dir))
    if not all(hellos.get(r, {}).get("state") == "left" for r in fault.ranks):
        return fault
    first = hellos[fault.ranks[0]]
    on = f" on {first['node']}" if first.get("node") else f" on {fault.nodes[0]}" if fault.nodes else ""
    when = time.strftime(" at %H:%M:%S", time.localtime(first["time"])) if "time" in first else ""
    ranks = ",".join(str(r) for r in fault.ranks)
    left = cite(contract.HELLO_FILE.format(rank=fault.ranks[0]), '"state": "left"')
    return Fault(FaultKind.AFTER_WORK, (), f"rank {ranks}{on} {(fault.signal or 'failed').lower()} after its work "
                                           f"ended (its shutdown() was done{when}): the job's results are intact",
                 fault.signal, fault.ranks, f"{fault.evidence}; {left}" if fault.evidence else left)
