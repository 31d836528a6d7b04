"""A practitioner's review of self-healing, judged by docs/node-failure.md's PROMISES (its decision table and the
text around it, and README's "Failed nodes" line), not by healing_sim.expected.

Each case is one failure a DDP job on Slurm really meets, written as a healing_sim Truth, with the verdict the docs
promise:

- NODE X      (infrastructure): again without X -- a spare of the allocation first, else a requeue excluding X; X
              quarantined. No spare and no room ("Never stranded"): again in place once the gate passes X, else end.
- SUSPECT X   (suspect): without X where a spare is free, else in place; never requeued or quarantined.
- UNCLEAR     (ambiguous): once in place on the same nodes; nothing excluded or quarantined.
- PROGRAM     (program): ends, never retried, no node blamed.
- GATE        (gate): the gate once more, else end; no node blamed.

Always: no healthy node given no rank, excluded by a requeue, or quarantined.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import List

import pytest

from clusterddp import contract

from . import healing_sim as sim
from .healing_sim import Truth, make

NODE, SUSPECT, UNCLEAR, PROGRAM, GATE = "NODE", "SUSPECT", "UNCLEAR", "PROGRAM", "GATE"
FAULT_WORD = {NODE: "infrastructure", SUSPECT: "suspect", UNCLEAR: "ambiguous", PROGRAM: "program", GATE: "gate"}


@dataclass(frozen=True)
class Case:
    id: str
    truth: Truth
    tier: str                      # the docs' promise
    why: str                       # the docs' sentence it rests on


def C(id_: str, tier: str, why: str, cls: str, launcher: str = "srun", per_node: int = 2, spare: bool = False,
      **kw) -> Case:
    return Case(id_, make(cls, launcher, per_node, spare, **kw), tier, why)


KERNEL_OOM = "one rank killed, nothing else said (whatever the ranks per node: the kernel's OOM killer ...)"
SLURM_OOM = "Slurm's OOM kill (cgroup / OverMemoryKill): program"
WHOLE = "every rank of X (two or more) ended by a signal at once, nothing from Slurm: suspect X"
SLURM_WORD = "srun's own `Node failure on X`: infrastructure on X"
SILENT = "X's ranks silent in a hang's roll call that every other rank answered: infrastructure"
OWN_HANG = "a hang in the script's own code or in a call the others are not in: ambiguous"
TWICE = "unclear again after that: the program's / the same hang twice at the same line: program"
NOT_CAUSE = "collateral errors are never the cause; a Python exception first: program"
STALE = "evidence is of this attempt only"
FORGED = "text a rank prints is never a node's evidence"

CASES: List[Case] = [
    # --- the kernel's OOM killer takes one rank -------------------------------------------------------------
    C("kernel-oom-one-rank/srun/4pn", UNCLEAR, KERNEL_OOM, "kill_one", "srun", 4, True, local=2),
    C("kernel-oom-one-rank/torchrun/4pn", UNCLEAR, KERNEL_OOM, "kill_one", "torchrun", 4, False, local=3),
    C("kernel-oom-one-rank/srun/1pn+spare", UNCLEAR, KERNEL_OOM + "; suspect needs two or more", "kill_one", "srun",
      1, True),
    C("kernel-oom-one-rank/torchrun/1pn+spare", UNCLEAR, KERNEL_OOM, "kill_one", "torchrun", 1, True),
    C("only-rank-of-1pn-node-killed/srun+spare", UNCLEAR, "suspect is 'two or more'; one rank killed: ambiguous",
      "node_killed", "srun", 1, True),
    # --- Slurm's memory kill --------------------------------------------------------------------------------
    C("slurm-overmemorykill/srun+spare-unused", PROGRAM, SLURM_OOM, "over_memory", "srun", 2, True),
    C("slurm-overmemorykill/torchrun/4pn/rfc5424-clock-9min-behind", PROGRAM, SLURM_OOM + " (<=10 min skew)",
      "over_memory", "torchrun", 4, True, skew_s=540, stamp="rfc5424"),
    C("slurm-overmemorykill/srun/iso-clock-590s-behind", PROGRAM, SLURM_OOM + " (<=10 min skew)", "over_memory",
      "srun", 2, False, skew_s=590),
    C("slurm-overmemorykill/spawn", PROGRAM, SLURM_OOM, "over_memory", "spawn", 2, True),
    C("cgroup-oom/srun-says-Out-Of-Memory", PROGRAM, SLURM_OOM, "cgroup_oom", "srun", 2, True, variant=0),
    C("cgroup-oom/slurmstepd-in-srun-err", PROGRAM, SLURM_OOM, "cgroup_oom", "srun", 2, False, variant=1),
    C("cgroup-oom/slurmstepd-in-node-log/torchrun", PROGRAM, SLURM_OOM, "cgroup_oom", "torchrun", 2, True,
      variant=2),
    # --- a GPU falls off the bus ----------------------------------------------------------------------------
    C("gpu-off-bus-node-ranks-killed/srun/4pn+spare", SUSPECT, WHOLE, "node_killed", "srun", 4, True),
    C("gpu-off-bus-node-ranks-killed/torchrun/4pn+spare", SUSPECT, WHOLE, "node_killed", "torchrun", 4, True),
    C("gpu-off-bus-node-ranks-killed/torchrun/4pn+spare/fqdn+swapped", SUSPECT, WHOLE, "node_killed", "torchrun",
      4, True, fqdn=True, swap=True),
    C("gpu-off-bus-node-ranks-killed/srun/4pn/no-spare", SUSPECT, WHOLE, "node_killed", "srun", 4, False),
    C("gpu-off-bus-node-ranks-killed/torchrun/2pn/no-spare", SUSPECT, WHOLE, "node_killed", "torchrun", 2, False),
    C("gpu-off-bus-node-ranks-killed/one-collateral-traceback", SUSPECT, WHOLE + "; collateral never the cause",
      "node_killed", "srun", 2, True, variant=1),
    C("gpu-off-bus-on-first-node/srun+spare", SUSPECT, WHOLE, "node_killed", "srun", 2, True, where_index=0),
    C("gpu-off-bus-one-rank-segfaults/srun", UNCLEAR, "a segfault: ambiguous", "segfault", "srun", 4, True),
    C("gpu-off-bus-ranks-wedged-silent/srun/4pn+spare", NODE, SILENT, "hang_silent", "srun", 4, True),
    C("gpu-off-bus-ranks-wedged-silent/torchrun/no-spare-room", NODE, SILENT, "hang_silent", "torchrun", 2, False,
      variant=1),
    # --- a node reboots ---------------------------------------------------------------------------------------
    C("node-reboot/srun+spare", NODE, SLURM_WORD, "node_dies", "srun", 2, True),
    C("node-reboot/torchrun/no-spare-room", NODE, SLURM_WORD, "node_dies", "torchrun", 4, False),
    C("node-reboot/spawn/no-spare-room", NODE, SLURM_WORD, "node_dies", "spawn", 2, False),
    C("node-reboot/srun/no-spare-no-room", NODE, SLURM_WORD + "; never stranded", "node_dies", "srun", 2, False,
      room="tight"),
    # --- NCCL / gloo timeouts -----------------------------------------------------------------------------------
    C("nccl-watchdog-timeout/srun/2pn", UNCLEAR, "torch's distributed watchdog aborting a waiting rank: ambiguous",
      "watchdog", "srun", 2, False),
    C("nccl-watchdog-timeout/torchrun/1pn/cancel-line", UNCLEAR, "torch's watchdog: ambiguous", "watchdog",
      "torchrun", 1, True, variant=2),
    C("nccl-watchdog-hides-node-failure/srun+spare/slurm-line-late", NODE, SLURM_WORD, "watchdog", "srun", 2, True,
      cause="node_failure", order="collateral_first"),
    C("nccl-watchdog-hides-node-failure/torchrun+spare", NODE, SLURM_WORD, "watchdog", "torchrun", 1, True,
      cause="node_failure"),
    # --- a rank stuck in its own data loader ---------------------------------------------------------------------
    C("loader-hang/srun/4pn+spare", UNCLEAR, OWN_HANG, "hang_script", "srun", 4, True),
    C("loader-hang/torchrun/2pn", UNCLEAR, OWN_HANG, "hang_script", "torchrun", 2, False),
    C("loader-hang-twice-same-line/srun", PROGRAM, TWICE, "hang_script", "srun", 2, False, repeat=True),
    C("loader-hang-twice-same-line/spawn", PROGRAM, TWICE, "hang_script", "spawn", 2, False, repeat=True),
    # --- rank-0-only evaluation deadlock ----------------------------------------------------------------------------
    C("rank0-eval-barrier-others-in-allreduce/srun/1pn", UNCLEAR, OWN_HANG, "hang_tie", "srun", 1, False,
      where_index=0),
    C("rank0-eval-own-code/srun/2pn+spare", UNCLEAR, OWN_HANG, "hang_script", "srun", 2, True, where_index=0),
    C("rank0-eval-barrier-twice/srun/1pn", PROGRAM, TWICE, "hang_tie", "srun", 1, False, where_index=0,
      repeat=True),
    # --- a node slow but alive (everyone waits at one place) --------------------------------------------------------
    C("slow-node-all-at-one-place/srun+spare", UNCLEAR, "a roll call with no odd rank out: ambiguous", "hang_all",
      "srun", 2, True),
    C("slow-node-all-at-one-place/torchrun/4pn", UNCLEAR, "a roll call with no odd rank out: ambiguous",
      "hang_all", "torchrun", 4, False),
    # --- srun's message order under load ---------------------------------------------------------------------------
    C("exception-collateral-first/srun/4pn/gloo", PROGRAM, NOT_CAUSE, "exception", "srun", 4, True,
      order="collateral_first"),
    C("exception-collateral-first/srun/nccl", PROGRAM, NOT_CAUSE, "exception", "srun", 2, False,
      order="collateral_first", variant=1),
    C("exception-collateral-first/torchrun", PROGRAM, NOT_CAUSE, "exception", "torchrun", 2, True,
      order="collateral_first"),
    C("abort-collateral-first/torchrun", PROGRAM, "SIGABRT: program", "abort", "torchrun", 2, True,
      order="collateral_first"),
    C("node-reboot-slurm-line-late/srun+spare", NODE, SLURM_WORD, "node_dies", "srun", 2, True,
      order="collateral_first"),
    # --- a requeued job whose earlier restart left files -----------------------------------------------------------
    C("requeued-stale-hang/exception/srun+spare", PROGRAM, STALE, "exception", "srun", 2, True, stale="hang"),
    C("requeued-stale-rendezvous/kill-one/srun", UNCLEAR, STALE, "kill_one", "srun", 2, False, stale="rendezvous"),
    C("requeued-stale-root-cause/exception/torchrun/fqdn", PROGRAM, STALE, "exception", "torchrun", 2, False,
      stale="root_cause", fqdn=True),
    C("requeued-stale-root-cause/kill-one/torchrun", UNCLEAR, STALE, "kill_one", "torchrun", 2, True,
      stale="root_cause"),
    C("requeued-rendezvous-9-beside-restart-10/srun", PROGRAM, STALE + " (numbered as numbers)", "exception", "srun",
      2, True, stale="rendezvous-9"),
    C("requeued-stale-hang/node-ranks-killed/srun", SUSPECT, STALE + "; " + WHOLE, "node_killed", "srun", 2, False,
      stale="hang"),
    # --- a health check that cannot start --------------------------------------------------------------------------
    C("gate-srun-cannot-start/before-first-attempt", GATE, "gate: the gate once more, else ends; no node blamed",
      "gate_no_start", "srun", 2, False),
    C("gate-srun-cannot-start/after-node-failure/torchrun", GATE, "gate: no node blamed", "gate_no_start",
      "torchrun", 2, True, after_failure=True),
    # --- the same failure twice ------------------------------------------------------------------------------------
    C("node-ranks-killed-twice/srun/room", NODE, "the same on X again: infrastructure", "node_killed", "srun", 2,
      False, repeat=True),
    C("node-ranks-killed-twice/torchrun/4pn/room", NODE, "the same on X again: infrastructure", "node_killed",
      "torchrun", 4, False, repeat=True),
    C("node-ranks-killed-twice/srun/no-room", NODE, "again: infrastructure; never stranded", "node_killed", "srun",
      2, False, repeat=True, room="tight"),
    C("one-rank-killed-twice/srun", PROGRAM, TWICE, "kill_one", "srun", 2, False, repeat=True),
    C("segfault-twice/torchrun", PROGRAM, TWICE, "segfault", "torchrun", 2, False, repeat=True),
    # --- the program prints text that looks like srun's or torchrun's -------------------------------------------------
    C("forged-srun-Killed/exception/srun", PROGRAM, FORGED, "exception", "srun", 2, True, forged="srun_killed"),
    C("forged-srun-Killed-after-CR/exception/srun", PROGRAM, FORGED + " (lines end at \\n only)", "exception",
      "srun", 2, True, forged="srun_killed", forged_sep="\r"),
    C("forged-Node-failure/kill-one/srun", UNCLEAR, FORGED, "kill_one", "srun", 2, False, forged="node_failure"),
    C("forged-Node-failure/node-ranks-killed/torchrun+spare", SUSPECT, FORGED + "; " + WHOLE, "node_killed",
      "torchrun", 2, True, forged="node_failure"),
    C("forged-Root-Cause/exception/srun", PROGRAM, FORGED + " (Root Cause under srun is the program's)",
      "exception", "srun", 2, True, forged="root_cause"),
    C("forged-Root-Cause-CR-raw-tee/exception/torchrun", PROGRAM, FORGED, "exception", "torchrun", 2, True,
      forged="root_cause", forged_sep="\r", forged_raw=True),
    C("forged-Root-Cause-U2028/kill-one/torchrun", UNCLEAR, FORGED, "kill_one", "torchrun", 2, False,
      forged="root_cause", forged_sep="\u2028"),
    C("forged-Root-Cause/loader-hang/spawn", UNCLEAR, FORGED, "hang_script", "spawn", 2, False, forged="root_cause"),
    # --- a rendezvous that missed a node / plain program failures ----------------------------------------------------
    C("rendezvous-missed-node/srun/4pn+spare", NODE, "a rendezvous that missed X's ranks", "rendezvous", "srun", 4,
      True),
    C("rendezvous-missed-node/spawn/1pn/room", NODE, "a rendezvous that missed X's ranks", "rendezvous", "spawn",
      1, False),
    C("python-exception/srun/1pn", PROGRAM, "a Python exception first", "exception", "srun", 1, False),
    C("assertion-abort/srun+spare", PROGRAM, "SIGABRT", "abort", "srun", 2, True, variant=1),
]


# --- the same failure twice, with an explicit history (an earlier attempt of this restart, already set aside) -------
_E = sim.Earlier
_KILLED1 = _E(0, 0, ("node1", "node2"), 143, "ambiguous", ("node2",), "rank(s) 2 on node2: killed (1 of 2)",
              contract.NEXT_IN_PLACE)


def _after(t: Truth, *history: sim.Earlier, **kw) -> Truth:
    return replace(t, attempt=1, history=tuple(history), **kw)


_SUSP2_SPARE = _E(0, 0, ("node1", "node2"), 143, "suspect", ("node2",), "rank(s) 2-3 on node2: killed (every one)",
                  contract.NEXT_RETRY)
_SUSP2_INPLACE = replace(_SUSP2_SPARE, next=contract.NEXT_IN_PLACE)
CASES += [
    Case("one-rank-killed-then-segfault-elsewhere", _after(make("segfault", "srun", 2, False, where_index=0),
                                                           _KILLED1), PROGRAM, "ambiguous: unclear again: program's"),
    Case("one-rank-killed-then-loader-hang", _after(make("hang_script", "srun", 2, False), _KILLED1), PROGRAM,
         "ambiguous: unclear again: program's"),
    Case("suspect-node2-in-place-then-suspect-node1", _after(make("node_killed", "srun", 2, False, where_index=0),
                                                             _SUSP2_INPLACE), SUSPECT,
         "'the same on X again' is X only: node1 is a first-time suspect"),
    Case("suspect-node2-to-spare-then-spare-node3-whole-killed",
         _after(make("node_killed", "srun", 2, True), _SUSP2_SPARE, hosts=("node1", "node2", "node3"),
                bad=("node2",), where="node3"), SUSPECT, "first time on node3; no spare left: in place"),
    Case("suspect-node2-to-spare-then-one-rank-on-node3",
         _after(make("kill_one", "srun", 2, True), _SUSP2_SPARE, hosts=("node1", "node2", "node3"), bad=("node2",),
                where="node3"), UNCLEAR, KERNEL_OOM),
]


def promise_problems(c: Case, o: sim.Observed) -> List[str]:
    t, x = c.truth, c.truth.where
    p: List[str] = []
    if o.rc != 0 or o.action not in ("gate", "run", "requeue", "end"):
        return [f"supervisor failed rc {o.rc}: {o.stderr.strip()[-300:]}"]
    before = sim.blamed_before(t)
    may_blame = {x} if c.tier in (NODE, SUSPECT) else set()
    wrong = (o.blamed - before) - may_blame
    if wrong:
        p.append(f"healthy node(s) blamed: {sorted(wrong)}")
    if o.fault != FAULT_WORD[c.tier]:
        p.append(f"fault recorded {o.fault or '-'!r}, docs: {FAULT_WORD[c.tier]!r}")
    in_place = t.ran_on
    if c.tier == NODE:
        if x not in o.fault_nodes:
            p.append(f"{x} not named in the record ({o.fault_nodes})")
        stranded = not t.spare and t.room == "tight"
        if stranded:  # "Never stranded": in place once the gate passes X, else end -- never a requeue
            if o.action == "requeue":
                p.append("requeued although the partition has no room without X")
        else:
            if x not in o.quarantined:
                p.append(f"{x} not quarantined")
            if t.spare:
                if o.action not in ("gate", "run") or x in o.next_run or len(o.next_run) != t.nodes:
                    p.append(f"not moved to the spare ({o.action} {','.join(o.next_run)})")
            elif o.action != "requeue" or x not in o.nodes:
                p.append(f"no requeue without {x} ({o.action} [{','.join(o.nodes)}])")
    elif c.tier == SUSPECT:
        if tuple(o.fault_nodes) != (x,):
            p.append(f"suspect recorded on {o.fault_nodes}, docs: ({x},)")
        if o.quarantined:
            p.append(f"quarantined {sorted(o.quarantined)}")
        if o.action not in ("gate", "run"):
            p.append(f"no next attempt in this allocation ({o.action})")
        elif t.spare:
            if x in o.next_run or len(o.next_run) != t.nodes:
                p.append(f"spare free but next attempt on {','.join(o.next_run)}")
        elif o.next_run != in_place:
            p.append(f"no spare but not in place ({','.join(o.next_run)})")
    elif c.tier == UNCLEAR:
        if o.action not in ("gate", "run") or o.next_run != in_place:
            p.append(f"not once in place on {','.join(in_place)} ({o.action} {','.join(o.next_run)})")
        if o.quarantined or o.newly_bad:
            p.append(f"excluded/quarantined {sorted(o.newly_bad | o.quarantined)}")
    elif c.tier == PROGRAM:
        if o.action != "end" or o.exit == 0:
            p.append(f"did not end failing ({o.action}, exit {o.exit})")
    elif c.tier == GATE:
        if o.action not in ("gate", "end"):
            p.append(f"neither the gate again nor an end ({o.action})")
    return p


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_docs_promise(case: Case, tmp_path: Path):
    o = sim.simulate(case.truth, tmp_path)
    problems = promise_problems(case, o)
    assert not problems, (f"docs promise {case.tier} "
                          f"{'on ' + case.truth.where if case.tier in (NODE, SUSPECT) else '(no node)'} "
                          f"[{case.why}]\n  truth: {case.truth.describe()}\n  observed: {o.line()}\n  "
                          + "; ".join(problems))
