"""A ground-truth fault simulator for the supervisor's verdict (``python -m clusterddp.healing next``).

A ``Truth`` says what really happened to one attempt of a job (which launcher, which nodes, which failure and
where, what earlier restarts left behind, what the program printed); ``simulate`` WRITES what such a job leaves in
its run directory -- srun's own stderr for the attempt, the ranks' logs (rank-N.out or node-N.out, with torchrun's
"[defaultN]:" prefixes and its elastic error report), slurmstepd's lines, the runtime's own records (hellos,
exception records, the hang watchdog's roll call, the rendezvous report), attempts.tsv, the partition's sinfo --
then asks the supervisor in-process, as the batch script does, and returns what it answered and recorded.

``expected`` is the verdict computed from the truth alone, by the principle (never from clusterddp's decision code):

- NODE (exclude + quarantine): Slurm's own word about X; X's ranks silent in a hang roll call the others answered;
  a rendezvous that missed X's ranks; under torchrun X's agent and workers gone at once with Slurm's word.
- SUSPECT (every rank of X ended by a signal at once, X still answers, nothing from Slurm): the next attempt without
  X where a spare node is free, else in place; no quarantine (unless it happens again on X: then NODE).
- UNCLEAR (one rank killed, a segfault, a hang in the script's own code, a roll-call tie or everyone at one place,
  torch's watchdog aborting waiting ranks with no other word): one retry in place, nobody blamed; the same failure at
  the same place again is the program's.
- PROGRAM (a Python exception first, abort(), Slurm's memory kill): end, nobody blamed.
- STOPPED (Slurm's SIGTERM to the batch script with every node of the attempt up in Slurm's view: a cancel or a
  preemption): end, nobody blamed. A node dying whole is NODE whether the supervisor hears of it from srun's end or
  from Slurm's SIGTERM, and whether or not srun wrote Slurm's word before it was ended (``term``); after Slurm's
  SIGTERM Slurm requeues the job itself: the supervisor ends the attempt, recorded as a requeue without the node.

Text a rank prints is never node evidence: forged "Root Cause" blocks and srun lines printed by the program, and
stale files of earlier restarts, never change the expected verdict.

The file formats come from clusterddp/contract.py, clusterddp/rollcall.py and clusterddp/runtime/control.py (the
runtime's records are written with the runtime's own helpers where they are pure), torch's elastic error report
(torch/distributed/elastic/multiprocessing/errors: _MSG_FORMAT_TEMPLATE, _FAILURE_FORMAT_TEMPLATE; TailLog's
universal-newline tee) and Slurm's messages (srun's "srun: error: NODE: tasks A-B: WORD", "srun: error: Node failure
on X", slurmstepd's OverMemoryKill and cgroup OOM lines; log.c's "[%M] " logfile stamps, ISO 8601 or RFC 5424).
"""
from __future__ import annotations

import io
import json
import os
import random
import time
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Callable, Dict, FrozenSet, List, Optional, Sequence, Tuple

from clusterddp import contract, rollcall
from clusterddp.healing import __main__ as healing_cli
from clusterddp.healing import attempts as attempts_mod
from clusterddp.healing.__main__ import main as healing_main
from clusterddp.runtime import control
from clusterddp.runtime.env import DistEnv

#: Pass ``--launcher`` to the supervisor. None: pass it unless the supervisor's CLI rejects it with a usage error;
#: then it is left out from there on (and LAUNCHER_REJECTED says so).
PASS_LAUNCHER: Optional[bool] = None
LAUNCHER_REJECTED = False

NODE, SUSPECT, UNCLEAR, PROGRAM, STOPPED = "NODE", "SUSPECT", "UNCLEAR", "PROGRAM", "STOPPED"

CLASSES = ("exception", "abort", "segfault", "kill_one", "over_memory", "cgroup_oom", "node_dies", "node_killed",
           "hang_script", "hang_silent", "hang_tie", "hang_all", "watchdog", "rendezvous", "gate_no_start", "cancelled")
#: Which launchers a class can be told under: where the only trace of a failure is the program's own text (spawn's
#: parent printing "process 1 terminated with signal SIGKILL"), the truth is not knowable and is not generated.
LAUNCHERS_OF = {
    "exception": ("srun", "torchrun", "spawn"), "abort": ("srun", "torchrun", "spawn"),
    "segfault": ("srun", "torchrun"), "kill_one": ("srun", "torchrun"),
    "over_memory": ("srun", "torchrun", "spawn"), "cgroup_oom": ("srun", "torchrun", "spawn"),
    "node_dies": ("srun", "torchrun", "spawn"), "node_killed": ("srun", "torchrun"),
    "hang_script": ("srun", "torchrun", "spawn"), "hang_silent": ("srun", "torchrun", "spawn"),
    "hang_tie": ("srun", "torchrun", "spawn"), "hang_all": ("srun", "torchrun", "spawn"),
    "watchdog": ("srun", "torchrun"), "rendezvous": ("srun", "torchrun", "spawn"),
    "gate_no_start": ("srun", "torchrun", "spawn"), "cancelled": ("srun", "torchrun", "spawn"),
}
REPEATABLE = ("segfault", "kill_one", "hang_script", "hang_tie", "hang_all", "node_killed")
STALE_KINDS = ("hang", "rendezvous", "root_cause", "rendezvous-9")
FORGED_KINDS = ("root_cause", "srun_killed", "node_failure")
#: What str.splitlines() also ends a line at (and "\n"): a forged block may follow "[default0]:" after one of them.
SEPARATORS = ("\n", "\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028")

SITE = "/opt/venv/lib/python3.11/site-packages"
SCRIPT = "/home/u/train.py"
PARTITION = "gpu"
#: Attempts happen in the recent past (their records' end is the supervisor's now); whole minutes.
T_BASE = int(time.time()) // 60 * 60 - 6 * 3600


@dataclass(frozen=True)
class Earlier:
    """One line of attempts.tsv from before this attempt (contract.ATTEMPT_FIELDS)."""

    restart: int
    attempt: int
    nodes: Tuple[str, ...]
    exit: int
    fault: str
    fault_nodes: Tuple[str, ...]
    why: str
    next: str
    evidence: str = ""


@dataclass(frozen=True)
class Truth:
    cls: str                                  # one of CLASSES
    launcher: str = "srun"                    # srun | torchrun | spawn
    hosts: Tuple[str, ...] = ("node1", "node2")  # the allocation, in Slurm's order (spares after)
    nodes: int = 2                            # nodes per attempt
    per_node: int = 2                         # ranks per node
    restart: int = 0
    attempt: int = 0
    where: str = "node2"                      # the node where it happens (X)
    local: int = 0                            # which of X's ranks (local index) fails first
    bad: Tuple[str, ...] = ()                 # nodes given no rank before this attempt (earlier faults here)
    history: Tuple[Earlier, ...] = ()         # explicit earlier attempts (repeat and stale add their own)
    repeat: bool = False                      # the previous attempt of this restart failed the same way, in place
    stale: str = ""                           # what restart-1 left: hang | rendezvous | root_cause | rendezvous-9
    forged: str = ""                          # what the program printed: root_cause | srun_killed | node_failure
    forged_sep: str = "\n"                    # the line separator the program used in it
    forged_raw: bool = False                  # torchrun's tee copies the worker's bytes untranslated (adversarial)
    skew_s: int = 0                           # how far X's clock is behind (slurmstepd's stamps)
    stamp: str = "iso"                        # iso | rfc5424 (Slurm's LogTimeFormat)
    order: str = "cause_first"                # cause_first | collateral_first: the order srun learned of the ends
    room: str = "ample"                       # ample | tight: the partition beside the allocation; none: sinfo failed
    fqdn: bool = False                        # torchrun names hosts by FQDN
    swap: bool = False                        # node ranks dealt in reverse of Slurm's order (as c10d could: a
                                              # verdict must not rest on the layout; the static rendezvous keeps it)
    variant: int = 0                          # which of a class's wordings (see the writers)
    cause: str = "unknown"                    # watchdog: unknown | node_failure (the real cause elsewhere)
    term: str = ""                            # node_dies: "" srun ends and the script asks; "word": Slurm's SIGTERM
                                              # came first, srun's word written; "silent": srun ended without it
    elapsed_s: int = 300                      # when in the attempt it happened
    job_id: str = "4242"
    skip_start: bool = False                  # leave out the restart's `next start` (the batch script always runs
                                              # it; left out only to ask the `ended` verdict alone about stale logs)

    # --- derived -------------------------------------------------------------------------------------------
    @property
    def ran_on(self) -> Tuple[str, ...]:
        return tuple(h for h in self.hosts if h not in self.bad)[:self.nodes]

    @property
    def spare(self) -> bool:
        return any(h not in self.bad and h not in self.ran_on for h in self.hosts)

    @property
    def world(self) -> int:
        return self.nodes * self.per_node

    @property
    def phase(self) -> str:
        return "gated" if self.cls == "gate_no_start" else "ended"

    @property
    def start(self) -> int:
        return T_BASE + self.restart * 1800 + self.attempt * 600

    @property
    def step(self) -> str:
        return f"{self.job_id}.{self.attempt * 2}"

    def node_index(self, node: str) -> int:
        return self.ran_on.index(node)

    def group_rank(self, index: int) -> int:
        """The node rank torchrun's rendezvous dealt to the node at ``index`` of the step (srun, spawn: index)."""
        return self.nodes - 1 - index if self.launcher == "torchrun" and self.swap else index

    def ranks_on(self, node: str) -> List[int]:
        g = self.group_rank(self.node_index(node))
        return list(range(g * self.per_node, (g + 1) * self.per_node))

    def node_of(self, rank: int) -> str:
        g = rank // self.per_node
        for i, node in enumerate(self.ran_on):
            if self.group_rank(i) == g:
                return node
        raise ValueError(rank)

    @property
    def culprit(self) -> int:
        return self.ranks_on(self.where)[self.local % self.per_node]

    def describe(self) -> str:
        mods = [f"{k}={getattr(self, k)!r}" for k in ("repeat", "stale", "forged", "order", "room", "variant",
                                                       "cause", "skew_s", "stamp", "swap", "fqdn", "skip_start", "term")
                if getattr(self, k) != getattr(_DEFAULT, k)]
        return (f"{self.cls} under {self.launcher} on {','.join(self.hosts)} (ran on {','.join(self.ran_on)}, "
                f"bad {','.join(self.bad) or '-'}), {self.per_node}/node, restart {self.restart} attempt "
                f"{self.attempt}, at {self.where} local {self.local}" + (f"; {', '.join(mods)}" if mods else ""))


_DEFAULT = Truth("exception")


@dataclass(frozen=True)
class Expect:
    tier: str
    nodes: FrozenSet[str]          # NODE: to blame; SUSPECT: the suspect; else empty
    why: str
    in_place_required: bool = True  # UNCLEAR: the retry must be in place (the gated phase accepts an end too)


@dataclass(frozen=True)
class Observed:
    rc: int
    action: str
    nodes: Tuple[str, ...]
    bad: Tuple[str, ...]
    exit: int
    fault: str                      # the record's fault kind ("" when nothing was recorded)
    fault_nodes: Tuple[str, ...]
    next: str
    why: str
    evidence: str
    quarantined: FrozenSet[str]     # at_fault over the records this call appended
    newly_bad: FrozenSet[str]
    requeued_without: FrozenSet[str]  # a requeue's excluded nodes, less those excluded before
    next_run: Tuple[str, ...]       # the nodes the next attempt runs on (a gate: the first that pass)
    stdout: str
    stderr: str
    launcher_passed: bool

    @property
    def blamed(self) -> FrozenSet[str]:
        return self.newly_bad | self.requeued_without | self.quarantined

    def line(self) -> str:
        return (f"{self.action} [{','.join(self.nodes)}] bad [{','.join(self.bad)}] exit {self.exit}; recorded "
                f"{self.fault or '-'} on [{','.join(self.fault_nodes)}] next {self.next or '-'}; quarantined "
                f"[{','.join(sorted(self.quarantined))}]; why: {self.why[:160]}")


# =================================================================================================================
# the truth space
# =================================================================================================================
def make(cls: str, launcher: str = "srun", per_node: int = 2, spare: bool = False, where_index: int = 1,
         repeat: bool = False, stale: str = "", **kw) -> Truth:
    """A consistent truth: the allocation, the restart and the history that ``repeat``/``stale``/the class need."""
    restart, hosts = 0, ["node1", "node2"] + (["node3"] if spare else [])
    if stale:
        restart = 10 if stale == "rendezvous-9" else 1
        hosts = ["node1", "node3"] + (["node4"] if spare else [])  # requeued without node2 (its evidence is stale)
    bad: Tuple[str, ...] = ()
    history: Tuple[Earlier, ...] = ()
    attempt = 1 if repeat else 0
    if cls == "gate_no_start" and kw.pop("after_failure", False):
        spare = True
        hosts = hosts if len(hosts) > 2 else hosts + (["node4"] if stale else ["node3"])
        lost = hosts[1]
        bad, attempt = (lost,), 1
        history = (Earlier(restart, 0, tuple(hosts[:2]), 1, "infrastructure", (lost,), "Slurm reported a node failure",
                           contract.NEXT_RETRY, f'srun-{restart}.0.err: "srun: error: Node failure on {lost}"'),)
    if cls == "node_dies" or (cls == "watchdog" and kw.get("cause") == "node_failure"):
        where_index = 1  # the batch script runs on the first node: a job whose first node died has no supervisor
    if cls == "node_killed" and repeat and len(hosts) > 2:
        hosts = hosts[:2]  # the first time it ran in place: no spare was free
    truth = Truth(cls=cls, launcher=launcher, hosts=tuple(hosts), nodes=2, per_node=per_node, restart=restart,
                  attempt=attempt, where="", bad=bad, history=history, repeat=repeat, stale=stale, **kw)
    return replace(truth, where=truth.ran_on[where_index % 2])


NODE_CLASSES = ("node_dies", "hang_silent", "rendezvous", "watchdog", "node_killed")


def draw(choose: Callable[[Sequence], object], node_only: bool = False) -> Truth:
    """One truth of the space; ``choose(options)`` picks (hypothesis' st.data, or a seeded random.Random.choice).
    ``node_only``: only truths whose verdict is NODE (Slurm's word, silence in a roll call, a missed rendezvous,
    the same whole-node kill again after a retry in place)."""
    cls = choose(NODE_CLASSES if node_only else CLASSES)
    launcher = choose(LAUNCHERS_OF[cls])
    per_node = choose((2, 4) if cls == "node_killed" else (1, 2, 4))
    repeat = cls in REPEATABLE and (node_only or choose((False, False, True)))
    stales = [""] + [s for s in STALE_KINDS if (s != "root_cause" or launcher == "torchrun")]
    stale = choose(stales + [""] * 4) if cls != "gate_no_start" else ""
    if stale == "root_cause":
        per_node = max(2, per_node)  # (restart 0's story: every rank of node2 killed twice in place, then requeued)
    forged = choose(("",) * 3 + FORGED_KINDS) if cls != "gate_no_start" else ""
    spare = choose((False, True))
    kw = dict(forged=forged, forged_sep=choose(SEPARATORS) if forged == "root_cause" else "\n",
              forged_raw=choose((False, True)), skew_s=choose((0, 5, 30, 90, 120)), stamp=choose(("iso", "rfc5424")),
              order=choose(("cause_first", "collateral_first")), room=choose(("ample", "ample", "tight")),
              fqdn=choose((False, True)), swap=choose((False, True)), variant=choose((0, 1, 2)),
              cause="node_failure" if node_only else choose(("unknown", "node_failure")),
              elapsed_s=choose((20, 60, 300, 3600)), local=choose(tuple(range(per_node))))
    if cls == "gate_no_start":
        kw["after_failure"] = choose((False, True))
    if cls == "node_dies":
        kw["term"] = choose(("", "", "word", "silent"))
    return make(cls, launcher, per_node, spare, choose((0, 1)), repeat, stale, **kw)


def sample(seed: int, n: int) -> List[Truth]:
    rng = random.Random(seed)
    return [draw(rng.choice) for _ in range(n)]


# =================================================================================================================
# expected: the principle, from the truth alone
# =================================================================================================================
def expected(t: Truth) -> Expect:
    x = frozenset({t.where})
    c = t.cls
    if c == "exception":
        return Expect(PROGRAM, frozenset(), "a Python exception was the first failure")
    if c == "abort":
        return Expect(PROGRAM, frozenset(), "abort(): the process ended itself")
    if c in ("over_memory", "cgroup_oom"):
        return Expect(PROGRAM, frozenset(), "Slurm's memory kill")
    if c in ("segfault", "kill_one", "hang_script", "hang_tie", "hang_all"):
        if t.repeat:
            return Expect(PROGRAM, frozenset(), "the same unclear failure again at the same place")
        return Expect(UNCLEAR, frozenset(), "one rank's end, or a hang the roll call does not pin on a node")
    if c == "node_killed":
        if t.repeat:
            return Expect(NODE, x, "every rank of the node killed at once, again after a retry in place")
        return Expect(SUSPECT, x, "every rank of the node ended by a signal at once, nothing from Slurm")
    if c in ("node_dies", "hang_silent", "rendezvous"):
        return Expect(NODE, x, {"node_dies": "Slurm's node failure", "hang_silent": "silent in the roll call",
                                "rendezvous": "its ranks missed the rendezvous"}[c])
    if c == "watchdog":
        if t.cause == "node_failure":
            return Expect(NODE, x, "Slurm's node failure (the aborting ranks only waited)")
        return Expect(UNCLEAR, frozenset(), "torch's watchdog aborted the waiting ranks; the cause is unknown")
    if c == "gate_no_start":
        return Expect(UNCLEAR, frozenset(), "the health gate's own srun could not start", in_place_required=False)
    if c == "cancelled":
        return Expect(STOPPED, frozenset(), "Slurm's SIGTERM with every node of the attempt up: cancelled or preempted")
    raise ValueError(c)


def all_history(t: Truth) -> List[Earlier]:
    """Every earlier attempt's record: what its stale files imply, the truth's own, then its repeat's first time
    (as a supervisor that retried it in place would have recorded it; ``simulate`` keeps the supervisor's own record
    instead where it did retry in place)."""
    out: List[Earlier] = []
    if t.stale:
        out += _stale_history(t)
    out += list(t.history)
    if t.repeat:
        out.append(_first_time(t))
    return out


def _first_time(t: Truth) -> Earlier:
    e = expected(replace(t, repeat=False))
    nodes = () if t.cls in ("hang_tie", "hang_all") else (t.where,)
    return Earlier(t.restart, t.attempt - 1, t.ran_on, _status(replace(t, attempt=t.attempt - 1)), "ambiguous",
                   nodes, f"{e.why} (retried once in place)", contract.NEXT_IN_PLACE)


def blamed_before(t: Truth) -> FrozenSet[str]:
    """Nodes already given no rank or excluded by earlier attempts (not this attempt's verdict)."""
    out = set(t.bad)
    for e in all_history(t):
        if e.fault == "infrastructure" and e.next in (contract.NEXT_RETRY, contract.NEXT_REQUEUE):
            out |= set(e.fault_nodes)
    return frozenset(out)


def check(t: Truth, o: Observed) -> List[str]:
    """Every way the observed verdict breaks the principle (empty: it holds)."""
    e = expected(t)
    bad: List[str] = []
    if o.rc != 0 or o.action not in ("gate", "run", "requeue", "end"):
        return [f"the supervisor failed (rc {o.rc}): {o.stderr.strip()[-300:]}"]
    healthy = set(t.hosts) - set(e.nodes)
    wrongly = (o.blamed & healthy) - blamed_before(t)
    if wrongly:
        bad.append(f"(a) healthy node(s) {sorted(wrongly)} blamed")
    # The documented exception (docs/node-failure.md "Never stranded"): with no spare and no room to requeue without
    # the node, the job runs again in place once the health gate passes the node (clusterddp's own check, newer
    # evidence), recorded "infrastructure ... in-place" and not quarantined, rather than end or wait forever.
    stuck = e.tier == NODE and not t.spare and t.room == "tight" and o.action == "gate" and o.next == "in-place" \
        and o.fault == "infrastructure" and set(e.nodes) <= set(o.fault_nodes) and not o.quarantined
    if e.tier == NODE and not stuck:
        for n in e.nodes:
            if n not in o.quarantined:
                bad.append(f"(b) {n} not quarantined")
            if n in o.next_run:
                bad.append(f"(b) {n} runs the next attempt")
        if t.term:  # Slurm's SIGTERM: Slurm requeues the job itself; the attempt is recorded as that requeue
            if o.action != "end" or o.next != contract.NEXT_REQUEUE:
                bad.append(f"(b) after Slurm's SIGTERM for a failed node: {o.action}, next {o.next!r} (expected the "
                           "end of this allocation, recorded as Slurm's requeue)")
        elif o.action == "end":
            spare_or_room = t.spare or t.room == "ample"
            if spare_or_room:
                bad.append("(b) ended although a spare or the partition's room allowed going on without the node")
        elif t.spare and o.action == "requeue":
            bad.append("(b) requeued although a spare was free")
    if e.tier == PROGRAM:
        if o.action != "end":
            bad.append(f"(c) PROGRAM did not end the job ({o.action})")
        elif o.exit == 0:
            bad.append("(c) PROGRAM ended with exit 0")
        if o.blamed - blamed_before(t):
            bad.append(f"(c) PROGRAM blamed {sorted(o.blamed - blamed_before(t))}")
    if e.tier == UNCLEAR:
        in_place = tuple(h for h in t.hosts if h not in t.bad)[:t.nodes]
        if o.blamed - blamed_before(t):
            bad.append(f"(c) UNCLEAR blamed {sorted(o.blamed - blamed_before(t))}")
        if e.in_place_required or o.action != "end":
            if o.action not in ("gate", "run") or o.next_run != in_place:
                bad.append(f"(c) UNCLEAR not retried in place on {','.join(in_place)} ({o.action} "
                           f"{','.join(o.next_run)})")
    if e.tier == STOPPED:
        if o.action != "end" or o.exit == 0 or o.next != contract.NEXT_END or o.fault:
            bad.append(f"(c) STOPPED did not end the job with a failure and no fault ({o.action}, exit {o.exit}, "
                       f"fault {o.fault!r}, next {o.next!r})")
        if o.blamed - blamed_before(t) or o.quarantined:
            bad.append(f"(c) STOPPED blamed {sorted((o.blamed - blamed_before(t)) | o.quarantined)}")
    if e.tier == SUSPECT:
        if o.quarantined:
            bad.append(f"(c) SUSPECT quarantined {sorted(o.quarantined)}")
        if o.action not in ("gate", "run"):
            bad.append(f"(c) SUSPECT: no next attempt in this allocation ({o.action})")
        elif t.spare:
            if t.where in o.next_run or len(o.next_run) != t.nodes:
                bad.append(f"(c) SUSPECT with a spare free: the next attempt is not without {t.where} "
                           f"({','.join(o.next_run)})")
        elif o.next_run != t.ran_on:
            bad.append(f"(c) SUSPECT without a spare: not in place ({','.join(o.next_run)})")
    return bad


# =================================================================================================================
# text: what the tools print
# =================================================================================================================
def _ranges(ids: Sequence[int]) -> str:
    nums, out, i = sorted(set(ids)), [], 0
    while i < len(nums):
        j = i
        while j + 1 < len(nums) and nums[j + 1] == nums[j] + 1:
            j += 1
        out.append(str(nums[i]) if i == j else f"{nums[i]}-{nums[j]}")
        i = j + 1
    return ",".join(out)


def srun_tasks(node: str, tasks: Sequence[int], word: str) -> str:
    """srun's own line about tasks that ended (slurm/src/srun: "srun: error: node2: tasks 2-3: Killed")."""
    return f"srun: error: {node}: task{'s' if len(tasks) > 1 else ''} {_ranges(tasks)}: {word}"


def _glog(level: str, t: float, pid: int, where: str, msg: str) -> str:
    """torch's log line ("E1204 02:52:29.220000 4711 torch/distributed/...:1003] msg")."""
    us = int(round(t * 1e6))
    lt = time.localtime(us // 1000000)
    return f"{level}{lt.tm_mon:02d}{lt.tm_mday:02d} {time.strftime('%H:%M:%S', lt)}.{us % 1000000:06d} {pid} " \
           f"{where}] {msg}"


def slurm_stamp(t: float, form: str) -> str:
    """slurmstepd's logfile stamp: "[%M] " with LogTimeFormat iso8601_ms or rfc5424_ms (src/common/log.c)."""
    ms = int(round(t * 1000))
    lt = time.localtime(ms // 1000)
    base = time.strftime("%Y-%m-%dT%H:%M:%S", lt) + f".{ms % 1000:03d}"
    if form == "rfc5424":
        z = time.strftime("%z", lt) or "+0000"
        base += f"{z[:3]}:{z[3:]}"
    return f"[{base}]"


def slurm_clock(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(int(t)))


USER_TB = [
    "Traceback (most recent call last):",
    f'  File "{SCRIPT}", line 140, in <module>',
    "    main()",
    f'  File "{SCRIPT}", line 112, in main',
    "    loss = train_step(model, batch)",
    "           ^^^^^^^^^^^^^^^^^^^^^^^^",
    f'  File "{SCRIPT}", line 33, in train_step',
    '    raise ValueError(f"bad batch at step {step}")',
    "ValueError: bad batch at step 1234",
]


def collateral_tb(rank: int, variant: int) -> List[str]:
    """What the other ranks raise once a peer is gone (gloo's connection error, or NCCL's)."""
    last = ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer "
            "[10.0.0.2]:41234" if variant % 2 == 0 else
            "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:317, "
            "remote process exited or there was a network error, NCCL version 2.21.5\nncclRemoteError: A call "
            "failed possibly due to a network error or a remote process exiting prematurely.")
    return ["Traceback (most recent call last):", f'  File "{SCRIPT}", line 140, in <module>', "    main()",
            f'  File "{SCRIPT}", line 112, in main', "    loss = train_step(model, batch)",
            f'  File "{SCRIPT}", line 61, in train_step', "    dist.all_reduce(grad)",
            f'  File "{SITE}/torch/distributed/c10d_logger.py", line 81, in wrapper',
            "    return func(*args, **kwargs)",
            f'  File "{SITE}/torch/distributed/distributed_c10d.py", line 2806, in all_reduce',
            "    work.wait()"] + last.split("\n")


def _rank_prefixed(rank: int, lines: List[str]) -> List[str]:
    """torch prints an uncaught exception of a process-group member with "[rankN]: " on every line."""
    return [f"[rank{rank}]: {line}" for line in lines]


TERMINATE = {
    0: ["terminate called after throwing an instance of 'std::runtime_error'", "  what():  shape mismatch in "
        "fused_adam: expected [4096] got [4095]"],
    1: ["python3: /src/ops/scan.cpp:88: void scan_kernel(int): Assertion `n > 0' failed."],
    2: [],  # abort() with nothing said
}


def nccl_watchdog(rank: int, t: float) -> List[str]:
    """torch's NCCL watchdog taking the process down after a collective timed out (ProcessGroupNCCL.cpp)."""
    g = _glog("E", t, 50000 + rank, "ProcessGroupNCCL.cpp:632", "")[:-1]
    what = (f"[PG ID 0 PG GUID 0(default_pg) Rank {rank}] Process group watchdog thread terminated with exception: "
            f"[Rank {rank}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5012, OpType=ALLREDUCE, "
            "NumelIn=25557032, NumelOut=25557032, Timeout(ms)=600000) ran for 600031 milliseconds before timing out.")
    return [f"[rank{rank}]:[{g}] [Rank {rank}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5012, "
            "OpType=ALLREDUCE, NumelIn=25557032, NumelOut=25557032, Timeout(ms)=600000) ran for 600031 milliseconds "
            "before timing out.",
            f"[rank{rank}]:[{g}] [Rank {rank}] Some NCCL operations have failed or timed out. Due to the "
            "asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.",
            f"[rank{rank}]:[{g}] [Rank {rank}] To avoid data inconsistency, we are taking the entire process down.",
            "terminate called after throwing an instance of 'c10::DistBackendError'",
            f"  what():  {what}",
            "Exception raised from checkTimeout at /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:635 "
            "(most recent call first):",
            f"frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x98 (0x7f3a1c4b9446 in "
            f"{SITE}/torch/lib/libc10.so)"]


# --- torch's elastic error report (torch/distributed/elastic/multiprocessing/errors/__init__.py) --------------
FAILURE_TEMPLATE = """[${idx}]:
  time      : ${time}
  host      : ${hostname}
  rank      : ${rank} (local_rank: ${local_rank})
  exitcode  : ${exitcode} (pid: ${pid}) ${signal_name}
  error_file: ${error_file}
  traceback : ${message}"""
MSG_TEMPLATE = """
${boarder}
${title}
${section}
Failures:
${other_failures}
${section}
Root Cause (first observed failure):
${root_failure}
${boarder}"""
_SIGNAMES = {1: "SIGHUP", 4: "SIGILL", 5: "SIGTRAP", 6: "SIGABRT", 7: "SIGBUS", 8: "SIGFPE", 9: "SIGKILL",
             11: "SIGSEGV", 13: "SIGPIPE", 15: "SIGTERM"}


@dataclass(frozen=True)
class Failure:
    """One worker in torch's ProcessFailure terms."""
    rank: int
    local_rank: int
    pid: int
    exitcode: int
    timestamp: int


def elastic_report(name: str, host: str, failures: Sequence[Failure]) -> str:
    """ChildFailedError.format_msg(): the root cause is the earliest (the first of equal times, in dict order)."""
    from string import Template

    root = min(failures, key=lambda f: f.timestamp)
    title = f"{name} FAILED"
    width, root_fmt, others = len(title), "", []
    for idx, f in enumerate(failures):
        signal = _SIGNAMES.get(-f.exitcode, "") if f.exitcode < 0 else ""
        message = (f"Signal {-f.exitcode} ({signal or '<N/A>'}) received by PID {f.pid}" if f.exitcode < 0 else
                   "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html")
        fmt = Template(FAILURE_TEMPLATE).substitute(
            idx=idx, time=datetime.fromtimestamp(f.timestamp).isoformat(sep="_"), hostname=host, rank=f.rank,
            local_rank=f.local_rank, exitcode=f.exitcode, pid=f.pid, signal_name=f" ({signal})" if signal else "",
            error_file="<N/A>", message=message)
        width = max(width, max(len(line) for line in fmt.split("\n")))
        if f is root:
            root_fmt = fmt
        else:
            others.append(fmt)
    width = min(width, 60)
    return Template(MSG_TEMPLATE).substitute(boarder="=" * width, title=title, section="-" * width,
                                             root_failure=root_fmt,
                                             other_failures="\n".join(others or ["  <NO_OTHER_FAILURES>"]))


def torchrun_exit(report: str) -> List[str]:
    """The agent's uncaught ChildFailedError, as Python prints it (torchrun exits 1)."""
    return ["Traceback (most recent call last):",
            '  File "/opt/venv/bin/torchrun", line 8, in <module>', "    sys.exit(main())", "             ^^^^^^",
            f'  File "{SITE}/torch/distributed/elastic/multiprocessing/errors/__init__.py", line 357, in wrapper',
            "    return f(*args, **kwargs)",
            f'  File "{SITE}/torch/distributed/run.py", line 936, in main', "    run(args)",
            f'  File "{SITE}/torch/distributed/run.py", line 927, in run', "    elastic_launch(",
            f'  File "{SITE}/torch/distributed/launcher/api.py", line 156, in __call__',
            "    return launch_agent(self._config, self._entrypoint, list(args))",
            f'  File "{SITE}/torch/distributed/launcher/api.py", line 383, in launch_agent',
            "    raise ChildFailedError(",
            "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: "] + report.split("\n")[1:]


def torchrun_signalled(pid: int, t: float) -> List[str]:
    """The agent ended by srun's SIGTERM (torch's SignalException; torchrun exits 1)."""
    return [_glog("W", t, pid, "torch/distributed/elastic/agent/server/api.py:719",
                  "Received Signals.SIGTERM death signal, shutting down workers"),
            "Traceback (most recent call last):",
            '  File "/opt/venv/bin/torchrun", line 8, in <module>', "    sys.exit(main())",
            f'  File "{SITE}/torch/distributed/elastic/multiprocessing/api.py", line 84, in '
            "_terminate_process_handler",
            "    raise SignalException(f\"Process {os.getpid()} got signal: {sigval}\", sigval=sigval)",
            f"torch.distributed.elastic.multiprocessing.api.SignalException: Process {pid} got signal: 15"]


def spawn_exit(index: int, exitcode: int, child_tb: Optional[List[str]]) -> List[str]:
    """torch.multiprocessing.spawn's parent re-raising a child's failure (spawn.py ProcessContext.join)."""
    head = ["Traceback (most recent call last):", f'  File "{SCRIPT}", line 150, in <module>',
            "    runtime.spawn(main)", f'  File "{SITE}/clusterddp/runtime/group.py", line 336, in spawn',
            "    mp.spawn(_spawned, nprocs=n, args=(fn, args))",
            f'  File "{SITE}/torch/multiprocessing/spawn.py", line 340, in spawn',
            '    return start_processes(fn, args, nprocs, join, daemon, start_method="spawn")',
            f'  File "{SITE}/torch/multiprocessing/spawn.py", line 296, in start_processes',
            "    while not context.join():", f'  File "{SITE}/torch/multiprocessing/spawn.py", line 211, in join']
    if child_tb is not None:
        return head + ["    raise ProcessRaisedException(msg, error_index, failed_process.pid)",
                       "torch.multiprocessing.spawn.ProcessRaisedException: ", "",
                       f"-- Process {index} terminated with the following error:"] + child_tb
    if exitcode < 0:
        return head + ["    raise ProcessExitedException(",
                       f"torch.multiprocessing.spawn.ProcessExitedException: process {index} terminated with signal "
                       f"{_SIGNAMES.get(-exitcode, 'SIGKILL')}"]
    return head + ["    raise ProcessExitedException(",
                   f"torch.multiprocessing.spawn.ProcessExitedException: process {index} terminated with exit code "
                   f"{exitcode}"]


# =================================================================================================================
# one attempt's leavings
# =================================================================================================================
#: How a process ended: (srun's word, the exit code torch reports, srun's exit status contribution)
ENDS = {
    "exc": ("Exited with exit code 1", 1), "coll": ("Exited with exit code 1", 1),
    "exit79": ("Exited with exit code 79", 79), "exit78": ("Exited with exit code 78", 78),
    "kill": ("Killed", -9), "memkill": ("Killed", -9), "oom": ("Out Of Memory", -9),
    "segv": ("Segmentation fault (core dumped)", -11), "abort": ("Aborted (core dumped)", -6),
    "wd_abort": ("Aborted (core dumped)", -6), "term": ("Terminated", -15), "kill_late": ("Killed", -9),
}
SPONTANEOUS = ("exc", "coll", "exit79", "exit78", "kill", "memkill", "oom", "segv", "abort", "wd_abort")


@dataclass
class _End:
    how: str          # a key of ENDS, or "lost" (its node died), or "wait" (ended by srun's termination)
    t: float          # when (true time)
    learn: float = 0  # when srun learned of it (its line's place in srun's stderr)


@dataclass
class _Attempt:
    t: Truth
    ends: Dict[int, _End] = field(default_factory=dict)
    out: Dict[int, List[str]] = field(default_factory=dict)       # each rank's own output lines
    tb: Dict[int, List[str]] = field(default_factory=dict)        # what ended a rank (spawn: its parent prints it)
    stepd: Dict[str, List[str]] = field(default_factory=dict)     # slurmstepd's lines in a node's first task's log
    srun_extra: List[Tuple[float, str]] = field(default_factory=list)  # srun/slurmstepd lines in srun's stderr
    records: Dict[int, dict] = field(default_factory=dict)        # exception records
    hello_state: Dict[int, str] = field(default_factory=dict)     # rank -> state ("" : no hello)
    dumps: Optional[List[dict]] = None
    missing: Dict[int, str] = field(default_factory=dict)
    rendezvous: bool = False
    lost_nodes: Tuple[str, ...] = ()
    kill_on_term: str = "term"                                    # how the rest end after srun's termination
    term_at: float = 0.0                                          # when srun was signalled (Slurm's SIGTERM)


def _frames(kind: str, line: int = 61) -> List[dict]:
    user = [{"file": SCRIPT, "line": 140, "func": "<module>", "lib": False, "text": "main()"},
            {"file": SCRIPT, "line": 112, "func": "main", "lib": False, "text": "loss = train_step(model, batch)"}]
    if kind == "own":
        return user + [{"file": SCRIPT, "line": 47, "func": "load_shard", "lib": False,
                        "text": "while not os.path.exists(marker): time.sleep(1)"}]
    return user + [{"file": SCRIPT, "line": line, "func": "train_step", "lib": False, "text": "dist.all_reduce(grad)"},
                   {"file": f"{SITE}/torch/distributed/c10d_logger.py", "line": 81, "func": "wrapper", "lib": True,
                    "text": "return func(*args, **kwargs)"},
                   {"file": f"{SITE}/torch/distributed/distributed_c10d.py", "line": 2806, "func": "all_reduce",
                    "lib": True, "text": "work.wait()"}]


def _dump(t: Truth, rank: int, kind: str, when: float, line: int = 61) -> dict:
    return {"rank": rank, "node": t.node_of(rank), "pid": 40000 + rank, "time": when, "source": "runtime",
            "beats": 5012, "threads": [
                {"name": "MainThread", "main": True, "frames": _frames(kind, line)},
                {"name": "Thread-2 (_pin_memory_loop)", "main": False, "frames": [
                    {"file": "/usr/lib/python3.11/threading.py", "line": 1002, "func": "_bootstrap", "lib": True},
                    {"file": f"{SITE}/torch/utils/data/_utils/pin_memory.py", "line": 59, "func": "_pin_memory_loop",
                     "lib": True}]}]}


def _record(t: Truth, rank: int, when: float, kind: str, message: str, where: str, user: str) -> dict:
    """runtime/control.py Control._record_exceptions: the excepthook's record."""
    return {"rank": rank, "restart": t.restart, "time": when, "type": kind, "message": message[:500],
            "where": where, "user": user}


def _plan(t: Truth) -> _Attempt:
    """What happened, rank by rank (the class's story), before any file is written."""
    a = _Attempt(t)
    ranks = list(range(t.world))
    t0 = t.start + t.elapsed_s
    x, r0 = t.where, t.culprit
    xr = t.ranks_on(x)
    others = [r for r in ranks if r not in xr]
    for r in ranks:
        a.out[r] = [f"step {s} loss {2.5 - s / 1000:.3f}" for s in (100, 200)] if r == 0 else []
        a.hello_state[r] = "joined"
        a.ends[r] = _End("wait", 0)
    coll_kind = ("builtins.RuntimeError", "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by "
                 "peer [10.0.0.2]:41234") if t.variant % 2 == 0 else \
        ("torch.distributed.DistBackendError", "NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:317, "
         "remote process exited or there was a network error, NCCL version 2.21.5")

    def collateral(rs: Sequence[int], when: float) -> None:
        for i, r in enumerate(rs):
            a.ends[r] = _End("coll", when + 0.05 * i)
            a.tb[r] = collateral_tb(r, t.variant)
            if t.launcher != "spawn":  # (spawn's _wrap catches it: the parent prints it, no excepthook, no record)
                a.out[r] += _rank_prefixed(r, a.tb[r])
                a.records[r] = _record(t, r, when + 0.05 * i, *coll_kind,
                                       f"{SITE}/torch/distributed/distributed_c10d.py:2806", f"{SCRIPT}:61")

    c = t.cls
    if c == "exception":
        a.ends[r0] = _End("exc", t0)
        a.tb[r0] = list(USER_TB)
        if t.launcher != "spawn":  # (spawn's _wrap catches it: no excepthook, no record)
            a.out[r0] += _rank_prefixed(r0, USER_TB)
            a.records[r0] = _record(t, r0, t0, "builtins.ValueError", "bad batch at step 1234", f"{SCRIPT}:33",
                                    f"{SCRIPT}:33")
        # the peers' collective fails at once (gloo: the socket closes) or after a while (variant 1, 2)
        collateral([r for r in ranks if r != r0][: max(1, t.world // 2)], t0 + (0.1 if t.variant == 0 else 0.8))
    elif c == "abort":
        a.ends[r0] = _End("abort", t0)
        a.out[r0] += TERMINATE[t.variant % 3]
    elif c == "segfault":
        a.ends[r0] = _End("segv", t0)
        if t.variant % 2 == 0:
            a.out[r0] += ["Fatal Python error: Segmentation fault", "",
                          "Current thread 0x00007f3a2d7fe740 (most recent call first):",
                          f'  File "{SCRIPT}", line 77 in custom_op', f'  File "{SCRIPT}", line 61 in train_step']
    elif c == "kill_one":
        a.ends[r0] = _End("kill", t0)
    elif c == "over_memory":
        for i, r in enumerate([r0] + [r for r in xr if r != r0]):
            a.ends[r] = _End("memkill", t0 + 0.1 * i)
        a.kill_on_term = "kill_late"  # Slurm kills the whole step: the rest are SIGKILLed too
        used, limit = 1626045440 + 4096 * t.variant, 1572864000
        line = (f"{slurm_stamp(t0 + 0.637 - t.skew_s, t.stamp)} error: StepId={t.step} exceeded memory limit ({used} > "
                f"{limit}), being killed")
        a.stepd.setdefault(x, []).append(line)
    elif c == "cgroup_oom":
        a.ends[r0] = _End("oom", t0)
        said = f"Detected 1 oom_kill event in StepId={t.step}. Some of the step tasks have been OOM Killed."
        if t.variant == 1:
            a.srun_extra.append((t0 + 0.15, f"slurmstepd: error: {said}"))
        elif t.variant == 2:
            a.stepd.setdefault(x, []).append(f"{slurm_stamp(t0 + 0.412 - t.skew_s, t.stamp)} error: {said}")
    elif c == "node_dies":
        for r in xr:
            a.ends[r] = _End("lost", t0)
        a.lost_nodes = (x,)
        nf = t0 + (30 if t.order == "collateral_first" else 0.5)
        if t.term == "silent":  # the batch script's SIGTERM ended srun before Slurm's word reached it
            a.srun_extra += _srun_terminated(nf)
            a.term_at = nf
        else:
            a.srun_extra.append((nf, f"srun: error: Node failure on {x}"))
        if t.variant == 1 and t.term != "silent":
            a.srun_extra.append((nf + 0.1, "srun: Job step aborted: Waiting up to 32 seconds for job step to finish."))
        if t.order == "collateral_first":
            collateral(others, t0 + 2)
    elif c == "node_killed":
        for r in xr:
            a.ends[r] = _End("kill", t0)
        if t.variant == 1:
            collateral(others[:1], t0 + 1.5)
    elif c in ("hang_script", "hang_silent", "hang_tie", "hang_all"):
        a.dumps = []
        for r in ranks:
            if c == "hang_silent" and r in xr:
                continue
            if c == "hang_script" and r == r0:
                kind, line = "own", 61
            elif c == "hang_tie" and r in xr:
                kind, line = "wait", 70
            else:
                kind, line = "wait", 61
            a.dumps.append(_dump(t, r, kind, t0 + 0.2 + 0.01 * r, line))
            a.ends[r] = _End("exit79", t0 + 16 + 0.1 * r)
        if c == "hang_silent":
            a.kill_on_term = "kill_late" if t.variant == 1 else "term"
    elif c == "cancelled":  # scancel or a preemption: Slurm's SIGTERM; the batch script ends srun (stop_grace)
        a.srun_extra += _srun_terminated(t0)
        a.term_at = t0
    elif c == "watchdog":
        waiting = [r for r in ranks if r != r0] if t.cause == "unknown" else others
        for i, r in enumerate(waiting):
            a.ends[r] = _End("wd_abort", t0 + 0.02 * i)
            a.out[r] += nccl_watchdog(r, t0)
        if t.cause == "node_failure":
            for r in xr:
                a.ends[r] = _End("lost", t0 - 300)
            a.lost_nodes = (x,)
            a.srun_extra.append((t0 + (2 if t.order == "collateral_first" else -290),
                                 f"srun: error: Node failure on {x}"))
        else:
            a.kill_on_term = "kill_late" if t.variant == 1 else "term"
    elif c == "rendezvous":
        a.rendezvous = True
        for r in xr:
            a.hello_state[r] = ""
        for r in others:
            a.hello_state[r] = "rendezvous"
            a.ends[r] = _End("exit78", t0 + 0.1 * r)
    else:
        raise ValueError(c)
    # srun learns of each end a little after it; collateral_first: the cause's line comes late (its node's message)
    for r, e in a.ends.items():
        e.learn = e.t + 0.2 + (5 if t.order == "collateral_first" and r == r0 and c in ("exception", "abort")
                               else 0)
    if t.order == "collateral_first" and c in ("exception", "abort"):
        for r in ranks:
            if r != r0 and a.ends[r].how == "wait" and c == "abort":
                a.ends[r] = _End("coll", t0 + 1, t0 + 1.2)
                a.tb[r] = collateral_tb(r, t.variant)
                if t.launcher != "spawn":
                    a.out[r] += _rank_prefixed(r, a.tb[r])
                    a.records[r] = _record(t, r, t0 + 1, *coll_kind,
                                           f"{SITE}/torch/distributed/distributed_c10d.py:2806", f"{SCRIPT}:61")
                break
    return a


def _task_lines(t: Truth, a: _Attempt) -> Tuple[List[Tuple[float, str]], Dict[int, Tuple[str, float]]]:
    """srun's task lines (srun: one task per rank; torchrun/spawn: one per node) and each task's end."""
    # the ends srun sees, per task: (how, true time, learn time)
    tasks: Dict[int, Tuple[str, float, float]] = {}
    if t.launcher == "srun":
        for r, e in a.ends.items():
            tasks[r] = (e.how, e.t, e.learn)
    else:
        for i, node in enumerate(t.ran_on):
            ends = [a.ends[r] for r in t.ranks_on(node)]
            if node in a.lost_nodes:
                tasks[i] = ("lost", 0, 0)
                continue
            spont = [e for e in ends if e.how in SPONTANEOUS]
            if not spont:
                tasks[i] = ("wait", 0, 0)
                continue
            first = min(spont, key=lambda e: e.t)
            if first.how == "memkill":  # Slurm's step kill: the agent (or spawn's parent) goes with its workers
                tasks[i] = ("memkill", first.t, first.learn)
            elif first.how == "oom":
                tasks[i] = ("oom", first.t + 0.5, first.learn + 0.5)
            else:
                tasks[i] = ("coll", first.t + 0.5, first.learn + 0.5)  # the agent / parent exits 1
    lines: List[Tuple[float, str]] = []
    ordered = sorted(((v[2], k, v) for k, v in tasks.items() if v[0] in SPONTANEOUS))
    final: Dict[int, Tuple[str, float]] = {}
    terminating = None
    for learn, task, (how, when, _) in ordered:
        lines.append((learn, srun_tasks(_task_node(t, task), [task], ENDS[how][0])))
        final[task] = (how, when)
        if terminating is None and ENDS[how][1] != 0:
            terminating = learn + 0.25  # (ends srun learns together come in one message, before it acts)
    if terminating is None and (a.lost_nodes or a.term_at):
        said = [w for w, line in a.srun_extra if "Node failure" in line] + ([a.term_at] if a.term_at else [])
        terminating = min(said) + 0.02
    if terminating is not None:
        if not a.term_at:  # (Slurm's SIGTERM reaches srun itself: no kill-on-bad-exit termination of its own)
            lines.append((terminating, f"srun: Terminating StepId={t.step}"))
        waiting = [k for k, v in tasks.items() if v[0] == "wait"]
        for node in dict.fromkeys(_task_node(t, k) for k in waiting):
            if t.variant == 2 and t.cls not in ("node_dies",):
                lines.append((terminating + 0.05, f"slurmstepd: error: *** STEP {t.step} ON {node} CANCELLED AT "
                                                  f"{slurm_clock(terminating)} ***"))
        word = ENDS[a.kill_on_term][0]
        if t.launcher == "torchrun" and t.cls != "over_memory":
            word = "Exited with exit code 1"  # the agent ends its workers on SIGTERM and exits 1 (SignalException)
        for k in waiting:
            final[k] = (a.kill_on_term, terminating + 0.3)
        by_node: Dict[str, List[int]] = {}
        for k in waiting:
            by_node.setdefault(_task_node(t, k), []).append(k)
        for node, ks in by_node.items():
            lines.append((terminating + 0.3, srun_tasks(node, ks, word)))
    # merge consecutive lines of one node with the same word (srun reports a node's tasks in one message)
    lines.sort(key=lambda p: p[0])
    merged: List[Tuple[float, str]] = []
    for when, line in lines:
        if merged and line.startswith("srun: error: ") and merged[-1][1].startswith("srun: error: ") \
                and when - merged[-1][0] < 0.5:
            prev = merged[-1][1].split(": ")
            cur = line.split(": ")
            if len(prev) == 5 and len(cur) == 5 and prev[2] == cur[2] and prev[4] == cur[4]:
                ids = _expand(prev[3].split(" ", 1)[1]) + _expand(cur[3].split(" ", 1)[1])
                merged[-1] = (merged[-1][0], srun_tasks(cur[2], ids, cur[4]))
                continue
        merged.append((when, line))
    return merged, final


def _expand(text: str) -> List[int]:
    out: List[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def _task_node(t: Truth, task: int) -> str:
    return t.node_of(task) if t.launcher == "srun" else t.ran_on[task]


def _status(t: Truth) -> int:
    """srun's exit status as the batch script sees it (the highest code, 128 + the highest signal)."""
    if t.launcher != "srun":  # the torchrun agent / spawn's parent exits 1 whatever its workers did
        return 137 if t.cls == "over_memory" else 1
    return {"hang_script": 79, "hang_silent": 79, "hang_tie": 79, "hang_all": 79, "rendezvous": 78,
            "abort": 134, "segfault": 139, "kill_one": 143, "node_killed": 143, "over_memory": 137,
            "cgroup_oom": 143, "watchdog": 134, "cancelled": 143}.get(t.cls, 143 if t.term == "silent" else 1)


def _srun_terminated(t: float) -> List[Tuple[float, str]]:
    """srun's own lines when Slurm's SIGTERM (slurmstepd signals the whole batch step, srun with it) ends it."""
    return [(t, "srun: got SIGCONT"), (t, "srun: forcing job termination"),
            (t + 0.01, "srun: Job step aborted: Waiting up to 32 seconds for job step to finish.")]


def _write(path: Path, lines: Sequence[str], append: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(line + "\n" for line in lines)
    with open(path, "a" if append else "w", encoding="utf-8", newline="") as fh:
        fh.write(text)


def _forged_lines(t: Truth) -> List[str]:
    """What the program itself printed that looks like a launcher's or Slurm's word (about a healthy node)."""
    liar = next(n for n in t.ran_on if n != t.where)
    if t.forged == "srun_killed":
        return [srun_tasks(liar, t.ranks_on(liar), "Killed")]
    if t.forged == "node_failure":
        return [f"srun: error: Node failure on {liar}"]
    when = t.start + max(1, t.elapsed_s - 5)
    rs = t.ranks_on(liar)
    report = elastic_report(SCRIPT, liar, [Failure(r, i, 60000 + r, -9, int(when)) for i, r in enumerate(rs)])
    return report.split("\n")


def _hello(t: Truth, rank: int, state: str, restart: Optional[int] = None, node: Optional[str] = None) -> dict:
    return {"rank": rank, "node": node or t.node_of(rank), "pid": 40000 + rank, "state": state,
            "restart": t.restart if restart is None else restart, "world_size": t.world,
            "local_world_size": t.per_node, "launcher": t.launcher, "time": t.start + 20 + 0.01 * rank}


def write_attempt(t: Truth, run: Path) -> None:
    """Every file this attempt leaves in the run directory (not attempts.tsv, not the verdict)."""
    a = _plan(t)
    # --- the runtime's records ---
    ranks_dir = run / "stacks" / "ranks"
    ranks_dir.mkdir(parents=True, exist_ok=True)
    for r, state in a.hello_state.items():
        if state:
            (run / contract.HELLO_FILE.format(rank=r)).write_text(json.dumps(_hello(t, r, state)))
    for r, rec in a.records.items():
        (run / contract.EXCEPTION_FILE.format(rank=r)).write_text(json.dumps(rec))
    if a.dumps is not None:
        directory = run / contract.HANG_DIR.format(restarts=t.restart)
        for d in a.dumps:
            rollcall.write_dump(directory, d)
        hellos = rollcall.read_hellos(run, t.restart)
        env = DistEnv(0, 0, t.world, t.per_node, 0, t.nodes, t.ran_on[0], 24242, t.launcher)
        environ = {"SLURM_JOB_NODELIST": ",".join(t.hosts), contract.RESTARTS: str(t.restart)}
        answered = {d["rank"] for d in a.dumps}
        missing = {r: (f"{control.node_of(r, env, hellos, environ)}: no dump; busy in native code holding "
                       "Python's lock, stopped, or gone" if r in hellos else
                       f"{control.node_of(r, env, hellos, environ)}: never started")
                   for r in range(t.world) if r not in answered}
        call = rollcall.build(a.dumps, t.world, missing)
        since = time.strftime("%H:%M:%S", time.localtime(t.start + t.elapsed_s - 900))
        call["since"], call["idle_s"] = since, 900
        call["summary"] = f"hung since {since}: {call['summary']}"
        (directory / "rollcall.json").write_text(json.dumps(call, indent=1))
        (directory / "rollcall.txt").write_text(rollcall.format_text(call))
        first = min(answered)
        a.out[first] += [f"clusterddp: rank {first}: hang watchdog: no rank advanced since {since} (900 s, limit "
                         f"900 s); dumping stacks and ending the job (exit 79)",
                         f"clusterddp: roll call ({directory}):"] + rollcall.format_text(call).splitlines()
    if a.rendezvous:
        hellos = rollcall.read_hellos(run, t.restart)
        writer = min(hellos)
        env = DistEnv(writer, writer % t.per_node, t.world, t.per_node, writer // t.per_node, t.nodes, t.ran_on[0],
                      24242, t.launcher)
        environ = {"SLURM_JOB_NODELIST": ",".join(t.hosts), contract.RESTARTS: str(t.restart)}
        report = control.rendezvous_report(env, run, 600.0, environ)
        (run / contract.RENDEZVOUS_REPORT.format(restarts=t.restart)).write_text(report + "\n")
        for r in hellos:
            a.out[r].append(f"clusterddp: rank {r}: {report}")
    # --- the program's own words that look like someone else's ---
    if t.forged:
        block = _forged_lines(t)
        if t.forged_sep != "\n":  # one printed line: the separator, then the block's lines joined by it
            block = [t.forged_sep + t.forged_sep.join(block)]
        a.out[t.ranks_on(t.ran_on[0])[0]][:0] = block
    # --- srun's stderr ---
    task_lines, final = _task_lines(t, a)
    err = sorted(task_lines + a.srun_extra, key=lambda p: p[0])
    _write(run / contract.STEP_ERR.format(restarts=t.restart, attempt=t.attempt), [line for _, line in err])
    # --- the logs ---
    if t.launcher == "srun":
        for r in range(t.world):
            lines = list(a.out[r])
            node = t.node_of(r)
            if node in a.stepd and r == min(t.ranks_on(node)):
                lines += a.stepd[node]
            _write(run / contract.RANK_LOG.format(rank=r), lines, append=True)
        return
    for i, node in enumerate(t.ran_on):
        rs = t.ranks_on(node)
        lines: List[str] = []
        if t.launcher == "torchrun":
            for lr, r in enumerate(rs):
                lines += _tee(t, lr, a.out[r])
        else:
            for r in rs:
                lines += a.out[r]
        lines += a.stepd.get(node, [])
        if node not in a.lost_nodes:
            lines += _agent_lines(t, a, i, node, final)
        _write(run / contract.NODE_LOG.format(node=i), lines, append=True)


def _tee(t: Truth, local: int, lines: Sequence[str]) -> List[str]:
    """torchrun --tee: TailLog reads each worker's file with readline() in text mode (universal newlines: "\\r" and
    "\\r\\n" end a line too) and writes "[defaultN]:" + line; other separators (\\x0b, \\x0c, \\x1c-\\x1e, \\x85,
    \\u2028) stay inside the prefixed line. ``forged_raw``: the bytes copied untranslated (a tee that keeps "\\r")."""
    prefix = contract.TORCHRUN_PREFIX.format(local_rank=local)
    out: List[str] = []
    for line in lines:
        pieces = [line] if t.forged_raw else line.replace("\r\n", "\n").replace("\r", "\n").split("\n")
        out += [prefix + p for p in pieces]
    return out


def _agent_lines(t: Truth, a: _Attempt, index: int, node: str, final: Dict[int, Tuple[str, float]]) -> List[str]:
    """What the node's torchrun agent (or spawn's parent) printed at the end."""
    rs = t.ranks_on(node)
    pid = 4700 + index
    spont = sorted(((a.ends[r].t, lr, r) for lr, r in enumerate(rs) if a.ends[r].how in SPONTANEOUS))
    if t.launcher == "spawn":
        if not spont:
            return []  # SIGTERM from srun: the parent dies without a word
        when, lr, r = spont[0]
        how = a.ends[r].how
        code = ENDS[how][1]
        child = None
        if how in ("exc", "coll"):
            child = ["Traceback (most recent call last):",
                     f'  File "{SITE}/torch/multiprocessing/spawn.py", line 90, in _wrap', "    fn(i, *args)",
                     f'  File "{SITE}/clusterddp/runtime/spawning.py", line 23, in _spawned',
                     "    fn(local_rank, *args)"] + a.tb[r][3:]
        if a.ends[r].how == "memkill":
            return []
        return spawn_exit(lr, code, child)
    if not spont:
        if t.cls == "over_memory":
            return []  # Slurm's step kill SIGKILLs every task of the step: the agent says nothing
        return torchrun_signalled(pid, final.get(index, ("", t.start + t.elapsed_s + 1))[1])
    if a.ends[rs[0]].how == "memkill" or any(a.ends[r].how == "memkill" for r in rs):
        return []  # Slurm SIGKILLed the agent with its workers
    first_t = int(spont[0][0])
    # the agent's first poll: every worker already ended (the same second); then it closes the rest (SIGTERM, -15)
    first_round = [(lr, r) for when, lr, r in spont if int(when) == first_t]
    failures = [Failure(r, lr, 50000 + r, ENDS[a.ends[r].how][1], first_t) for lr, r in sorted(first_round)]
    closed = [(lr, r) for lr, r in enumerate(rs) if (lr, r) not in first_round]
    out = [_glog("W", first_t + 0.1, pid, "torch/distributed/elastic/multiprocessing/api.py:1029",
                 f"Sending process {50000 + r} closing signal SIGTERM") for lr, r in closed]
    failures += [Failure(r, lr, 50000 + r, ENDS[a.ends[r].how][1] if a.ends[r].how in SPONTANEOUS else -15,
                         first_t + 1) for lr, r in closed]
    root = min(failures, key=lambda f: f.timestamp)
    out.append(_glog("E", first_t + 0.9, pid, "torch/distributed/elastic/multiprocessing/api.py:1003",
                     f"failed (exitcode: {root.exitcode}) local_rank: {root.local_rank} (pid: {root.pid}) of binary: "
                     "/opt/venv/bin/python3"))
    host = f"{node}.cluster.example" if t.fqdn else node
    return out + torchrun_exit(elastic_report(SCRIPT, host, failures))


# =================================================================================================================
# what earlier restarts and attempts left
# =================================================================================================================
def _stale_history(t: Truth) -> List[Earlier]:
    r = t.restart - 1
    old = ("node1", "node2")
    if t.stale == "rendezvous-9":
        out = [Earlier(k, 0, old, 0, "", (), "time limit", contract.NEXT_REQUEUE) for k in range(r)]
        return out + [Earlier(r, 0, old, 78, "infrastructure", ("node2",), "ranks 2-3 (node2) never arrived",
                              contract.NEXT_REQUEUE, f"stacks/rendezvous-{r}.txt")]
    if t.stale == "root_cause":
        return [Earlier(r, 0, old, 1, "ambiguous", ("node2",), "every rank of node2 ended by a signal",
                        contract.NEXT_IN_PLACE),
                Earlier(r, 1, old, 1, "infrastructure", ("node2",), "every rank of node2 ended by a signal, again "
                        "after a retry in place", contract.NEXT_REQUEUE, 'node-1.out: "torchrun\'s root cause"')]
    why = {"hang": "node2's ranks did not answer the hang watchdog's roll call",
           "rendezvous": "ranks 2-3 (node2) never arrived"}[t.stale]
    evidence = {"hang": f"stacks/hang-{r}/rollcall.json", "rendezvous": f"stacks/rendezvous-{r}.txt"}[t.stale]
    return [Earlier(r, 0, old, 79 if t.stale == "hang" else 78, "infrastructure", ("node2",), why,
                    contract.NEXT_REQUEUE, evidence)]


def write_stale(t: Truth, run: Path) -> None:
    """Restart t.restart-1's leftovers (a requeue sets nothing aside; srun --open-mode=append keeps its logs): it ran
    on node1,node2 with the same world size, and its verdict requeued the job without node2."""
    r = t.restart - 1
    old = replace(t, restart=r, hosts=("node1", "node2"), bad=(), swap=False, repeat=False, stale="", forged="",
                  history=(), attempt=0 if t.stale != "root_cause" else 1)
    hellos = run / "stacks" / "ranks"
    hellos.mkdir(parents=True, exist_ok=True)
    for rank in range(old.world):
        (run / contract.HELLO_FILE.format(rank=rank)).write_text(json.dumps(_hello(old, rank, "joined")))
    t0 = old.start + 400
    if t.stale == "hang":
        directory = run / contract.HANG_DIR.format(restarts=r)
        n1, n2 = old.ranks_on("node1"), old.ranks_on("node2")
        dumps = [_dump(old, rank, "own" if (i == len(n1) - 1 and len(n1) > 1) else "wait", t0 + 0.1 * i)
                 for i, rank in enumerate(n1)]
        for d in dumps:
            rollcall.write_dump(directory, d)
        missing = {rank: "node2: no dump; busy in native code holding Python's lock, stopped, or gone" for rank in n2}
        call = rollcall.build(dumps, old.world, missing)
        call["since"], call["idle_s"] = "01:00:00", 900
        call["summary"] = f"hung since 01:00:00: {call['summary']}"
        (directory / "rollcall.json").write_text(json.dumps(call, indent=1))
        (directory / "rollcall.txt").write_text(rollcall.format_text(call))
        if t.launcher == "srun":
            _write(run / "rank-0.out", ["clusterddp: rank 0: hang watchdog: no rank advanced since 01:00:00 (900 s, "
                                        "limit 900 s); dumping stacks and ending the job (exit 79)"], append=True)
    elif t.stale in ("rendezvous", "rendezvous-9"):
        n2 = old.ranks_on("node2")
        for rank in n2:
            (run / contract.HELLO_FILE.format(rank=rank)).unlink()
        report = (f"the rendezvous at node1:24242 did not complete in 600 s: {old.world - len(n2)} of {old.world} "
                  "ranks arrived; missing " + "; ".join(f"rank {k} (node2): never started" for k in n2))
        (run / contract.RENDEZVOUS_REPORT.format(restarts=r)).write_text(report + "\n")
        if t.launcher == "srun":
            _write(run / "rank-0.out", [f"clusterddp: rank 0: {report}"], append=True)
    elif t.stale == "root_cause":
        # attempt r.0 was set aside after its in-place retry; attempt r.1's node-1.out (node2's) stays, appended to
        rs = old.ranks_on("node2")
        fails = [Failure(k, i, 50000 + k, -9, int(t0)) for i, k in enumerate(rs)]
        lines = [_glog("E", t0 + 0.9, 4701, "torch/distributed/elastic/multiprocessing/api.py:1003",
                       f"failed (exitcode: -9) local_rank: 0 (pid: {50000 + rs[0]}) of binary: /opt/venv/bin/python3")]
        lines += torchrun_exit(elastic_report(SCRIPT, "node2.cluster.example" if t.fqdn else "node2", fails))
        aside = run / contract.ATTEMPT_DIR.format(restarts=r, attempt=0)
        _write(aside / "node-1.out", lines)
        _write(run / "node-1.out", lines, append=True)
        _write(run / contract.STEP_ERR.format(restarts=r, attempt=0), ["srun: error: node2: task 1: Exited with "
                                                                        "exit code 1"])
        _write(run / contract.STEP_ERR.format(restarts=r, attempt=1), ["srun: error: node2: task 1: Exited with "
                                                                        "exit code 1"])


def _sinfo(t: Truth) -> str:
    """sinfo --noheader --Node --partition=P --format='%N %t' after the attempt (clusterddp_room)."""
    if t.room == "none":
        return ""
    lines = []
    for h in t.hosts:
        state = "mix"
        if (t.cls == "node_dies" or (t.cls == "watchdog" and t.cause == "node_failure")) and h == t.where:
            state = "down*"
        elif t.cls == "cancelled" and h == t.where:
            state = ("mix", "mix*", "drng")[t.variant % 3]  # not responding a moment, or draining: ends no job
        lines.append(f"{h} {state}")
    if t.stale:
        lines.append("node2 drain")
    if t.room == "ample":
        lines += ["node5 idle", "node6 idle", "node7 mix"]
    if t.cls == "cancelled":
        lines.append("node9 down*")  # a node of the partition outside the allocation: not this attempt's
    return "\n".join(lines) + "\n"


def _write_history(run: Path, t: Truth, history: Sequence[Earlier]) -> None:
    for e in history:
        start = T_BASE + e.restart * 1800 + e.attempt * 600
        attempts_mod.append(run, attempts_mod.Attempt(e.restart, e.attempt, start, start + 300, e.nodes, e.exit,
                                                      e.fault, e.fault_nodes, e.why, e.next, e.evidence))


# =================================================================================================================
# the verdict
# =================================================================================================================
def retries(t: Truth) -> int:
    """--retries: 3, and 5 for a job whose earlier restart already spent two (the stale torchrun story), so that
    no verdict here is an exhausted budget's."""
    return 5 if t.stale == "root_cause" else 3


def _argv(t: Truth, run: Path, launcher: bool) -> List[str]:
    argv = ["next", t.phase, "--run-dir", str(run), "--hosts", ",".join(t.hosts), "--bad", ",".join(t.bad),
            "--restart", str(t.restart), "--attempt", str(t.attempt), "--partition", PARTITION,
            "--nodes", str(t.nodes), "--per-node", str(t.per_node), "--retries", str(retries(t)),
            "--max-requeues", str(max(2, t.restart + 2)), "--requeues"]
    if t.spare or t.cls == "gate_no_start":
        argv.append("--gate")
    if t.phase == "ended":
        signal = "TERM" if t.term or t.cls == "cancelled" else ""
        argv += ["--status", str(_status(t)), "--signal", signal, "--start", str(t.start),
                 "--ran-on", ",".join(t.ran_on)]
    if launcher:
        argv += ["--launcher", t.launcher]
    return argv


def _call(argv: List[str], job_id: str) -> Tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    saved = {k: os.environ.get(k) for k in ("SLURM_JOB_ID", contract.HANG_TIMEOUT, "SLURM_JOB_START_TIME")}
    os.environ["SLURM_JOB_ID"] = job_id
    os.environ[contract.HANG_TIMEOUT] = "900"
    os.environ.pop("SLURM_JOB_START_TIME", None)
    # After a SIGTERM the supervisor reads srun's messages again for a moment (tee may still be writing them); the
    # simulator writes every file before it asks: no wait.
    waited, healing_cli.TERM_WAIT_S = healing_cli.TERM_WAIT_S, 0.0
    try:
        with redirect_stdout(out), redirect_stderr(err):
            try:
                rc = healing_main(argv)
            except SystemExit as exc:
                rc = exc.code if isinstance(exc.code, int) else 2
    finally:
        healing_cli.TERM_WAIT_S = waited
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return rc, out.getvalue(), err.getvalue()


def _ask(argv: List[str], t: Truth) -> Tuple[int, str, str, bool]:
    """Call the supervisor with ``--launcher`` where PASS_LAUNCHER allows; a CLI that rejects it (a usage error)
    is asked again without it, and from then on (LAUNCHER_REJECTED)."""
    global PASS_LAUNCHER, LAUNCHER_REJECTED
    if PASS_LAUNCHER is not False:
        rc, out, err = _call(argv + ["--launcher", t.launcher], t.job_id)
        if not (rc == 2 and "--launcher" in err and "unrecognized arguments" in err):
            return rc, out, err, True
        PASS_LAUNCHER, LAUNCHER_REJECTED = False, True
    rc, out, err = _call(argv, t.job_id)
    return rc, out, err, False


def verdict(t: Truth, run: Path) -> Observed:
    """Ask the supervisor as the batch script does; what it answered and recorded."""
    before = attempts_mod.read(run)
    rc, out, err, passed = _ask(_argv(t, run, False), t)
    lines = out.split("\n")
    if rc != 0 or len(lines) < 4:
        return Observed(rc, "error", (), (), -1, "", (), "", "", "", frozenset(), frozenset(), frozenset(), (), out,
                        err, passed)
    act, nodes, bad, code = lines[-5:-1] if out.endswith("\n") else lines[-4:]
    nodes_t = tuple(n for n in nodes.split(",") if n)
    bad_t = tuple(n for n in bad.split(",") if n)
    after = attempts_mod.read(run)
    new = after[len(before):]
    last = new[-1] if new else None
    quarantined = frozenset(n for nodes_q, _ in attempts_mod.at_fault(new) for n in nodes_q)
    excluded_before = blamed_before(t)
    requeued = frozenset(nodes_t) - excluded_before if act == "requeue" else frozenset()
    if act == "run":
        next_run = nodes_t
    elif act == "gate":
        next_run = tuple(h for h in nodes_t if h not in bad_t)[:t.nodes]
    else:
        next_run = ()
    return Observed(rc, act, nodes_t, bad_t, int(code) if code.strip().lstrip("-").isdigit() else -1,
                    last.fault if last else "", last.fault_nodes if last else (), last.next if last else "",
                    last.why if last else "", last.evidence if last else "", quarantined,
                    frozenset(bad_t) - set(t.bad), requeued, next_run, out, err, passed)


def _first_attempt(t: Truth, run: Path) -> None:
    """The repeat's first time, in this allocation: its files, then the supervisor's own verdict on it. Where that
    was the retry in place the truth presupposes, its record and set-aside stand (the history is the program's own
    words); else they are replaced by the record of a retry in place (and the files set aside as it would)."""
    prev = replace(t, attempt=t.attempt - 1, repeat=False, forged="")
    write_attempt(prev, run)
    (run / contract.SINFO_FILE).write_text(_sinfo(prev))
    tsv = run / contract.ATTEMPTS_FILE
    saved = tsv.read_bytes() if tsv.exists() else b""
    first = verdict(prev, run)
    if first.action in ("gate", "run") and first.next == contract.NEXT_IN_PLACE and first.next_run == prev.ran_on:
        return
    tsv.write_bytes(saved)
    if not (run / contract.ATTEMPT_DIR.format(restarts=prev.restart, attempt=prev.attempt)).exists():
        attempts_mod.set_aside(run, prev.restart, prev.attempt)
    _write_history(run, t, [_first_time(t)])


def _start(t: Truth, run: Path) -> None:
    """The restart's first word with its supervisor (base.sh.j2: ``clusterddp_next start --began ...``) before its
    first attempt: the run directory checked, the allocation recorded, a requeued job's last logs set aside."""
    argv = ["next", "start", "--run-dir", str(run), "--hosts", ",".join(t.hosts), "--bad", "", "--restart",
            str(t.restart), "--attempt", "0", "--partition", PARTITION, "--nodes", str(t.nodes), "--per-node",
            str(t.per_node), "--retries", str(retries(t)), "--max-requeues", str(max(2, t.restart + 2)), "--requeues"]
    argv += ["--gate"] if t.spare or t.cls == "gate_no_start" else []
    argv += ["--began", f"{t.start - 10:.3f}"]
    rc, out, err, _ = _ask(argv, t)
    if rc != 0 or out.split("\n")[0] not in ("gate", "run"):
        raise RuntimeError(f"the supervisor's start refused the simulated job (rc {rc}): {out!r} {err[-500:]}")


def simulate(t: Truth, tmp_dir: Path) -> Observed:
    """Write what the job leaves for truth ``t`` under ``tmp_dir`` (a run directory of its own), then the verdict."""
    run = Path(tmp_dir) / f"run-{t.job_id}"
    run.mkdir(parents=True, exist_ok=False)
    (run / "health").mkdir()
    with open(run / contract.ALLOCATIONS_FILE, "w") as fh:
        if t.stale:
            for k in range(t.restart):
                began = T_BASE + k * 1800
                fh.write(f"begin\t{k}\t{began:.3f}\tnode1,node2\nend\t{k}\t{began + 1500:.3f}\n")
        if t.skip_start:
            fh.write(f"begin\t{t.restart}\t{T_BASE + t.restart * 1800:.3f}\t{','.join(t.hosts)}\n")
    if t.stale:
        write_stale(t, run)
    _write_history(run, t, (_stale_history(t) if t.stale else []) + list(t.history))
    if not t.skip_start:
        _start(t, run)
    if t.cls == "gate_no_start" and t.history:
        # the attempt before the gate: its node failure, set aside as the supervisor does before a retry
        prev = replace(t, cls="node_dies", bad=(), attempt=t.attempt - 1, history=(), where=t.bad[0], variant=0)
        write_attempt(prev, run)
        attempts_mod.set_aside(run, prev.restart, prev.attempt)
    if t.repeat:
        _first_attempt(t, run)
    if t.cls == "gate_no_start":
        (run / contract.HEALTH_DIR.format(restarts=t.restart, attempt=t.attempt)).mkdir(parents=True)
    else:
        write_attempt(t, run)
    (run / contract.SINFO_FILE).write_text(_sinfo(t))
    return verdict(t, run)
