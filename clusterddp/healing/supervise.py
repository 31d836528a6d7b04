"""The one supervisor of a job's attempts: after an attempt (or a health gate), what comes next, and the sentence
that says why. The batch script asks it (``python -m clusterddp.healing next``) and the local backend calls it; both
only carry out its answer. Pure: evidence and counts in, an Action out.

Policy from evidence (faults.py): a node's fault -> again without the node (a spare of the allocation first, then a
requeue that excludes it, never one that leaves too few nodes to run: then in place when the gate passes the node,
else end with the numbers); a suspect -> without it where a spare is free, else in place (never requeued for it,
never quarantined), and a second time on the same node -> that node's fault; ambiguous -> once in place on the same
nodes (no exclusion), and again after that -> the program's; the program's, after-work, unknown -> end.
"""
from __future__ import annotations

from enum import Enum
from typing import FrozenSet, Iterable, NamedTuple, Optional, Sequence, Tuple

from .. import contract
from .attempts import Attempt
from .faults import STATE_FLAGS, Fault, FaultKind, sinfo_states

#: The decision table, as docs/node-failure.md shows it (tests/test_supervise.py holds the two equal): the evidence
#: of one attempt, the fault it makes, what follows.
DECISIONS: Tuple[Tuple[str, FaultKind, str, str], ...] = (
    ("srun's own `Node failure on X`, Slurm's NODE_FAIL, or (Slurm's SIGTERM ended the attempt and srun was ended "
     "before it wrote its word) X DOWN in Slurm's own state once srun is gone (`sinfo`: `down`/`down*`; not "
     "responding alone, drain and fail end no job and are not evidence); X's ranks silent in a hang's roll call "
     "that every other rank answered; a rendezvous that missed X's ranks", FaultKind.INFRASTRUCTURE, "on X",
     "again without X: a spare of the allocation first, else a requeue that excludes it; X quarantined (where "
     "neither is possible, in place once the health gate passes X, and then not quarantined: never stranded)"),
    ("every rank of X (two or more) ended by a signal at once, nothing from Slurm: srun's `tasks 2-3: Killed`, or "
     "torchrun's own report listing each of X's workers", FaultKind.SUSPECT, "X",
     "again without X where a spare is free, else in place; never requeued or quarantined for it; the same on X "
     "again: infrastructure"),
    ("one rank killed, nothing else said (whatever the ranks per node: the kernel's OOM killer ends one process); "
     "a segfault, a bus error; a hang in the script's own code or in a call the others are not in; a roll call with "
     "no odd rank out; torch's distributed watchdog aborting a waiting rank", FaultKind.AMBIGUOUS, "",
     "once in place on the same nodes, nothing excluded or quarantined (the record names where it happened); any "
     "unclear failure again after that, the same or not: the program's"),
    ("a Python exception first (torch's distributed errors, DistBackendError and the like, are a lost peer's: never "
     "the cause); SIGABRT (abort(): an assertion, libstdc++'s `terminate called ...`); Slurm's OOM kill (cgroup's "
     "`Out Of Memory`, `Detected N oom_kill event`, OverMemoryKill's `exceeded memory limit`); the same hang twice at "
     "the same line (where the odd ranks wait, else where all do)", FaultKind.PROGRAM, "", "ends; never retried"),
    ("the failed rank had already finished (its `shutdown()` done)", FaultKind.AFTER_WORK, "",
     "ends; no node blamed (the results are intact)"),
    ("the health gate's own srun started no task on any node", FaultKind.GATE, "",
     "the gate once more (a retry), else ends; no node blamed"),
    ("nothing tells", FaultKind.UNKNOWN, "", "ends"),
)


#: Where a retry starts: the runtime decides (runtime/peerload.py), and each rank's log says which.
RESUMES = "from the survivors' memory where they kept it (peer heal), else the last checkpoint"

def decision_rows() -> str:
    """DECISIONS as the markdown table of docs/node-failure.md."""
    rows = ["| evidence (of this attempt only) | fault | what follows |", "|---|---|---|"]
    rows += [f"| {evidence} | **{kind}**{' ' + on if on else ''} | {follows} |"
             for evidence, kind, on, follows in DECISIONS]
    return "\n".join(rows) + "\n"


class Act(str, Enum):
    GATE = "gate"          # run the health gate on these nodes, then ask again
    RUN = "run"            # run the step on these nodes
    REQUEUE = "requeue"    # requeue the job excluding these nodes (none: as it was)
    END = "end"            # the job ends with this exit code

    __str__ = str.__str__


class Policy(NamedTuple):
    """What the job asked for (fixed for the job): the spec's numbers, as the script renders them."""
    nodes: int
    per_node: int = 1
    retries: int = 0
    requeues: bool = False
    max_requeues: int = 0
    gate: bool = False                 # a health gate before every attempt (--health-check, spares)
    exclude: Tuple[str, ...] = ()      # excluded at submission (a requeue keeps them out)
    local: bool = False                # the local backend's emulated nodes (no Slurm, no requeue)


class Room(NamedTuple):
    """The job's partition as sinfo described it when the attempt ended."""
    partition: str
    usable: Tuple[str, ...]            # nodes in a state that can run the job (idle, mixed, allocated, ...)


class Action(NamedTuple):
    act: Act
    nodes: Tuple[str, ...] = ()        # gate/run: these nodes; requeue: excluding these
    bad: Tuple[str, ...] = ()          # nodes of this allocation given no rank from now on
    exit: int = 0                      # end: the job's exit code
    say: Tuple[str, ...] = ()          # lines for the batch log
    next: str = contract.NEXT_END      # what the attempt's record says came next
    fault: Optional[Fault] = None      # the fault as finally judged (a repeat can change it)


def choose(hosts: Sequence[str], bad: Iterable[str], n: int) -> Optional[Tuple[str, ...]]:
    """The first ``n`` hosts of the allocation not at fault, or None when too few are left."""
    out = tuple(h for h in hosts if h not in set(bad))[:n]
    return out if len(out) == n else None


#: The kinds a retry may follow. Every retry of the job spends one of --retries, whatever came before it (a node
#: fault, a suspect, an ambiguous failure, a health gate that failed): one budget, in every restart of the job.
RETRIED = (FaultKind.INFRASTRUCTURE, FaultKind.SUSPECT, FaultKind.AMBIGUOUS, FaultKind.GATE)


def retries_used(history: Sequence[Attempt]) -> int:
    """Retries spent after faults (in this allocation or through a requeue), in every restart of the job."""
    return sum(1 for a in history if a.fault in RETRIED
               and a.next in (contract.NEXT_RETRY, contract.NEXT_IN_PLACE, contract.NEXT_REQUEUE))


def requeued_without(history: Sequence[Attempt]) -> FrozenSet[str]:
    """Nodes earlier requeues of this job left out after a fault."""
    return frozenset(n for a in history if a.next == contract.NEXT_REQUEUE and a.fault for n in a.fault_nodes)


def _end(fault: Fault, exit_code: int, bad: Sequence[str], *say: str) -> Action:
    return Action(Act.END, (), tuple(bad), exit_code, tuple(say), contract.NEXT_END, fault)


def _gate(hosts: Sequence[str], bad: Sequence[str], fault: Fault, nxt: str, say: Tuple[str, ...]) -> Action:
    """Retry: the health gate on every node of the allocation not at fault, then the first healthy ones run."""
    return Action(Act.GATE, tuple(h for h in hosts if h not in set(bad)), tuple(bad), 0, say, nxt, fault)


def after_failure(fault: Fault, *, history: Sequence[Attempt], policy: Policy, hosts: Sequence[str],
                  bad: Sequence[str], ran_on: Sequence[str], restart: int, room: Optional[Room],
                  exit_code: int) -> Action:
    """What follows a failed attempt whose evidence is ``fault`` (``history``: the job's earlier attempts)."""
    kind = fault.kind
    if kind == FaultKind.PROGRAM:
        return _end(fault, exit_code, bad, "clusterddp: not retried: the program's fault (it would fail again on "
                                           "any node)")
    if kind == FaultKind.AFTER_WORK:
        return _end(fault, exit_code, bad, "clusterddp: not retried: the work had ended; no node is blamed")
    if kind == FaultKind.UNKNOWN:
        return _end(fault, exit_code, bad, "clusterddp: not retried: nothing the job left tells a node fault from "
                                           "a program fault")
    used = retries_used(history)
    if used >= policy.retries:
        return _end(fault, exit_code, bad, f"clusterddp: not retried: {used} of --retries {policy.retries} used")
    if kind == FaultKind.AMBIGUOUS:
        prev = history[-1] if history else None
        if prev is None or prev.fault != FaultKind.AMBIGUOUS or prev.next != contract.NEXT_IN_PLACE:
            where = ",".join(ran_on)
            return _gate(hosts, bad, fault, contract.NEXT_IN_PLACE,
                         (f"clusterddp: retrying once in place on {where} (retry {used + 1} of {policy.retries}; "
                           "no node excluded, none quarantined), " + RESUMES,))
        # Unclear twice in a row: the same failure after a retry in place is the program's (a node is blamed only
        # on evidence about the node; none came).
        judged = fault._replace(kind=FaultKind.PROGRAM, nodes=(), why=f"{fault.why}; again after a retry in place "
                                f"(first: {prev.why[:120]}): the program")
        return _end(judged, exit_code, bad, "clusterddp: not retried: an unclear failure again after a retry in place "
                                            "is the program's; no node is blamed")
    if kind == FaultKind.SUSPECT:
        again = sorted({n for a in history if a.fault in (FaultKind.SUSPECT, FaultKind.INFRASTRUCTURE)
                        for n in a.fault_nodes} & set(fault.nodes))
        if again:  # the same node's ranks all lost twice: the node
            fault = fault._replace(kind=FaultKind.INFRASTRUCTURE, nodes=tuple(again),
                                   why=f"{fault.why}; the second time on {','.join(again)}: the node")
        elif fault.nodes:
            spared = _on_a_spare(fault, hosts, bad, policy, f"a suspect, not quarantined; retry {used + 1} of "
                                                          f"{policy.retries}")
            return spared or _gate(hosts, bad, fault, contract.NEXT_IN_PLACE,
                                   (f"clusterddp: retrying in place on {','.join(ran_on)}: no spare to leave "
                                    f"{','.join(fault.nodes)} out (a suspect, not quarantined; retry {used + 1} of "
                                    f"{policy.retries}), " + RESUMES,))
    if not fault.nodes:
        return _end(fault, exit_code, bad, "clusterddp: not retried: the node at fault is not known")
    spared = _on_a_spare(fault, hosts, bad, policy, f"retry {used + 1} of {policy.retries}")
    return spared or leave(fault, history=history, policy=policy, hosts=hosts,
                           bad=tuple(sorted(set(bad) | set(fault.nodes))), ran_on=ran_on, restart=restart, room=room,
                           exit_code=exit_code, in_place=True)


def _on_a_spare(fault: Fault, hosts: Sequence[str], bad: Sequence[str], policy: Policy, note: str) -> Optional[Action]:
    """Again in this allocation without the fault's nodes, when enough others are left (a spare), else None."""
    without = tuple(sorted(set(bad) | set(fault.nodes)))
    chosen = choose(hosts, without, policy.nodes)
    if chosen is None:
        return None
    return _gate(hosts, without, fault, contract.NEXT_RETRY,
                 (f"clusterddp: retrying on {','.join(chosen)} without {','.join(fault.nodes)} ({note}), " + RESUMES,))


def leave(fault: Fault, *, history: Sequence[Attempt], policy: Policy, hosts: Sequence[str], bad: Sequence[str],
          ran_on: Sequence[str], restart: int, room: Optional[Room], exit_code: int, in_place: bool) -> Action:
    """Too few healthy nodes left in this allocation: requeue without the nodes at fault when the partition still
    has room for the job; else (``in_place``) once more on the same nodes, if the health gate passes them; else
    end, with the numbers."""
    if policy.local:
        return _end(fault, exit_code, bad, "clusterddp: not retried: no healthy emulated node is left (--spare-nodes "
                                           "adds some)")
    if not policy.requeues:
        return _end(fault, exit_code, bad, "clusterddp: not retried: no healthy node is left in this allocation "
                                           "(--spare-nodes adds some) and requeue is off (--time or --requeue turns "
                                           "it on)")
    if restart >= policy.max_requeues:
        return _end(fault, exit_code, bad, "clusterddp: not retried: no healthy node is left in this allocation and "
                                           f"the requeue limit is reached ({restart} of --max-requeues "
                                           f"{policy.max_requeues})")
    excluded = tuple(sorted(requeued_without(history) | set(fault.nodes) | set(policy.exclude)))
    if room is None:
        return _end(fault, exit_code, bad, f"clusterddp: not requeued without {','.join(fault.nodes)}: sinfo could "
                                           "not describe the job's partition, so whether the job would still fit "
                                           "is not known (a job that cannot fit waits forever); the last "
                                           "checkpoint is kept")
    left = [n for n in room.usable if n not in set(excluded)]
    if len(left) >= policy.nodes:
        return Action(Act.REQUEUE, excluded, tuple(bad), 0, (), contract.NEXT_REQUEUE, fault)
    numbers = (f"partition {room.partition} has {len(room.usable)} usable node(s); without "
               f"{','.join(excluded)}, {len(left)} {'is' if len(left) == 1 else 'are'} left; the job needs "
               f"{policy.nodes}")
    if in_place and ran_on and set(fault.nodes) <= set(hosts):
        return _gate(hosts, sorted(set(bad) - set(fault.nodes)), fault, contract.NEXT_IN_PLACE,
                     (f"clusterddp: {numbers}: retrying in place on {','.join(ran_on)} if the health gate passes "
                      f"{','.join(fault.nodes)} (a requeue without it would wait forever)",))
    return _end(fault, exit_code, bad, f"clusterddp: not requeued: {numbers} (a requeue without it would wait "
                                       "forever); the last checkpoint is kept")


def after_gate(failed: Sequence[str], *, history: Sequence[Attempt], policy: Policy, hosts: Sequence[str],
               bad: Sequence[str], restart: int, room: Optional[Room]) -> Action:
    """After a health gate (``failed``: the nodes it failed): run on the first nodes not at fault, or (too few
    passed) requeue without them, or end."""
    without = tuple(sorted(set(bad) | set(failed)))
    chosen = choose(hosts, without, policy.nodes)
    if chosen is not None:
        return Action(Act.RUN, chosen, without)
    fault = Fault(FaultKind.INFRASTRUCTURE, without, "health gate")
    say = (f"clusterddp: fewer than {policy.nodes} healthy node(s) left in this allocation (not: "
           f"{','.join(without)})",)
    used = retries_used(history)
    if used >= policy.retries:  # a requeue is a retry too: one budget
        return _end(fault, contract.EXIT["RUNTIME"], without, *say,
                    f"clusterddp: not requeued: {used} of --retries {policy.retries} used")
    action = leave(fault, history=history, policy=policy, hosts=hosts, bad=without, ran_on=(), restart=restart,
                   room=room, exit_code=contract.EXIT["RUNTIME"], in_place=False)
    return action._replace(say=say + action.say)


def gate_not_run(*, history: Sequence[Attempt], policy: Policy, hosts: Sequence[str], bad: Sequence[str],
                 why: str) -> Action:
    """The health gate itself could not run (its srun started no task on any node): the gate's failure, not a
    fault of each node. Once more (a retry of the budget), else the job ends saying so; no node is blamed."""
    fault = Fault(FaultKind.GATE, (), f"the health gate could not run ({why}): no node is blamed")
    prev = history[-1] if history else None
    used = retries_used(history)
    if prev is not None and prev.fault == FaultKind.GATE or used >= policy.retries:
        return _end(fault, contract.EXIT["RUNTIME"], bad, "clusterddp: not retried: the health gate could not run "
                    f"(twice, or no retry left: {used} of --retries {policy.retries} used); the last checkpoint is "
                    "kept")
    return Action(Act.GATE, tuple(h for h in hosts if h not in set(bad)), tuple(bad), 0,
                  (f"clusterddp: the health gate could not run; trying it once more (retry {used + 1} of "
                   f"{policy.retries})",), contract.NEXT_IN_PLACE, fault)


def parse_room(partition: str, text: Optional[str]) -> Optional[Room]:
    """sinfo's ``--Node --format='%N %t'`` lines for the job's partition as a Room; None when it said nothing."""
    if text is None:
        return None
    usable, seen = [], 0
    for node, state, _ in sinfo_states(text.splitlines()[:100000]):
        seen += 1
        # usable: a state that takes jobs, with no flag of one that does not (faults.STATE_FLAGS; '#' and '-' do)
        if state.rstrip(STATE_FLAGS) in _USABLE and not any(c in state for c in "*~%!$@^"):
            usable.append(node)
    return Room(partition, tuple(dict.fromkeys(usable))) if seen else None


_USABLE = ("idle", "mix", "mixed", "alloc", "allocated", "comp", "completing", "plnd", "planned", "resv", "reserved")
