"""The drill's verdicts: each scenario's runs against the reference, step by step and checkpoint by checkpoint, the
first difference named; the report card. (Login side: torch only to read checkpoints, in check.py.)"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple

from .. import contract
from ..job.spec import JobSpec
from .check import component

SCENARIOS = contract.DRILL_SCENARIOS
OUTSIDE = ("everything the checkpoint holds was restored, yet the run differs at step {step} (resumed from step "
           "{resumed}): state outside the checkpoint (an LR scheduler, a GradScaler, an EMA model, a counter, your own "
           "random generator)")


class Run(NamedTuple):
    code: int
    events: Dict[int, List[dict]]   # rank -> its events in order
    log: Path


class Verdict(NamedTuple):
    scenario: str
    identical: bool
    why: str
    step: Optional[int] = None

    def as_json(self) -> dict:
        return self._asdict()


def numbered(runs: Sequence[Run], rank: int = 0) -> Iterator[Tuple[dict, int]]:
    """Each event of a scenario's runs (one rank's) with the step count at it: a process counts its should_stop()
    calls from the step it loaded (a new process, a retry's too; one that never loads, from 0)."""
    for run in runs:
        offset = 0
        for e in run.events.get(rank, []):
            if e["e"] == "load":
                offset = int(e.get("step") or 0) - int(e.get("n") or 0)
            yield e, offset + int(e.get("n") or 0)


def stopped_at(runs: Sequence[Run]) -> Optional[int]:
    """The step the drill's stop (should_stop() True) came at in these runs (rank 0's), None where none came."""
    return next((at for e, at in numbered(runs) if e["e"] == "stop"), None)


def _stop_save(runs: Sequence[Run]) -> Optional[Tuple[int, int]]:
    """(the step the save at the stop was given, the step count at that should_stop()) where they differ (rank 0's):
    should_stop() asked before the step's work, its batch already drawn."""
    stop = None
    for e, at in numbered(runs):
        if e["e"] == "stop":
            stop = at
        elif e["e"] == "save" and stop is not None:
            return (int(e["step"]), stop) if int(e["step"]) != stop else None
    return None


def resumes(runs: Sequence[Run]) -> str:
    """Where a scenario's runs resumed (rank 0's loads) and how many steps each redid: ' (resumed ...)'."""
    said, done = [], 0
    for e, at in numbered(runs):
        if e["e"] == "load" and e.get("step") is not None and done:
            how = "from the survivors' memory (peer heal)" if e.get("peer") else "from its checkpoint"
            said.append(f"resumed {how} at step {e['step']}, {max(0, done - int(e['step']))} step(s) redone")
        elif e["e"] == "step":
            done = at
    return f" ({'; '.join(said)})" if said else ""


def failed_run(name: str, what: str, last: Run) -> Optional[Verdict]:
    """The run that should have finished the job did not end well: whatever its files say, that is a FAIL (a
    resumed run that crashes after its last checkpoint would otherwise match the reference)."""
    if last.code == 0:
        return None
    return Verdict(name, False, f"{what}: the run that finishes the job ended with exit {last.code} (see {last.log})")


def _values(runs: Sequence[Run], rank: int) -> Tuple[Dict[int, Dict[int, List[list]]], Optional[str]]:
    """Global step -> {process: the values it reported at that step, in order}, over the runs of a scenario (a
    resumed run counts from the step it loaded; a step redone has two processes); and why it did not resume, if it
    did not."""
    out: Dict[int, Dict[int, List[list]]] = {}
    process = 0
    for e, at in numbered(runs, rank):
        if e["e"] == "load":
            process += 1
        elif e["e"] == "value":  # reported during step n + 1 (n: the should_stop() calls before it)
            out.setdefault(at + 1, {}).setdefault(process, []).append(e["v"])
    problem = None
    for run in runs:
        if run is not runs[0] or len(runs) == 1:
            resumed = any(e["e"] == "load" and e.get("step") is not None for e in run.events.get(rank, []))
            if not resumed and problem is None:
                calls = any(e["e"] == "load" for e in run.events.get(rank, []))
                problem = ("did not resume: started again at step 0" + ("" if calls else
                           " (the script never calls load_latest)"))
    return out, problem


def _last_save(runs: Sequence[Run]) -> Optional[str]:
    saves = [e["path"] for run in runs for e in run.events.get(0, []) if e["e"] == "save"]
    return saves[-1] if saves else None


def compare(name: str, what: str, ref: Run, runs: Sequence[Run], interrupted: int) -> Verdict:
    """The scenario against the reference: the first difference, where and in what."""
    for rank in sorted(ref.events):
        _, problem = _values(runs, rank)
        if problem:
            return Verdict(name, False, f"{what}: {problem}")
    loads = [e for run in runs for e in run.events.get(0, []) if e["e"] == "load" and e.get("step")]
    missing = sorted(set(loads[0].get("held", [])) - set(loads[0].get("restored", []))) if loads else []
    first: Optional[int] = None
    for rank in sorted(ref.events):
        expected, _ = _values([ref], rank)
        got, _ = _values(runs, rank)
        # Steps both report at: a report the interrupted run never reaches (an epoch-end line after the step it
        # stopped at) is not a difference by itself; what the run ends with is compared below.
        for step in sorted(set(expected) & set(got)):
            want = next(iter(expected[step].values()))
            # (each process's values at the step, in order: a process ended mid-step reported the first of them)
            if any(seq != want[:len(seq)] for seq in got[step].values()):
                first = step if first is None else min(first, step)
                break
    last_ref, last = _last_save([ref]), _last_save(runs)
    part = component(last_ref, last) if last_ref and last else None
    if first is None and part is None:
        return Verdict(name, True, f"{what}: bit-identical")
    if first is not None and first <= interrupted:
        # The same step's checkpoint of both runs, where both are still on disk (Checkpointer keeps the last few).
        kept = [{e["step"]: e["path"] for r in rs for e in r.events.get(0, []) if e["e"] == "save"
                 and os.path.exists(e["path"])} for rs in ([ref], runs)]
        common = sorted(set(kept[0]) & set(kept[1]))
        gen = component(kept[0][common[0]], kept[1][common[0]], generators=True) if common else None
        cause = (f"{gen}: not the same in two runs; seed what your data path uses" if gen else
                 "data order, an unseeded generator, or the hardware")
        return Verdict(name, False, f"{what}: differs from the reference at step {first}, before the interruption: "
                       f"the script is not deterministic ({cause})", first)
    if missing:
        return Verdict(name, False, f"{what}: differs after the resume (step {first}): the checkpoint holds the "
                       f"{' and '.join(missing)} but load_latest did not restore it (pass it: "
                       f"load_latest(model, optimizer, loader))", first)
    early = _stop_save(runs)
    if first is not None and early:
        return Verdict(name, False, f"{what}: differs after the resume (step {first}): its save at the stop was given "
                       f"step {early[0]} at should_stop() call {early[1]}: should_stop() was asked before the step's "
                       "work, with its batch already drawn, which the checkpoint counts as done and the resumed run "
                       "skips; ask it after optimizer.step() (or the count leaves out steps the calls count: a "
                       "skipped one)", first)
    if first is not None:
        resumed = loads[0]["step"] if loads else "?"
        order = [e for r in [ref, *runs] for e in r.events.get(0, []) if e["e"] == "order"]
        if order:  # (peer heal compares a step's save() with its should_stop(): runtime/peerheal.py)
            return Verdict(name, False, f"{what}: differs after the resume (step {first}, resumed from step "
                           f"{resumed}): {order[0]['why']}; a save at should_stop() (the stop's) then holds another "
                           "state than the other saves", first)
        return Verdict(name, False, f"{what}: " + OUTSIDE.format(step=first, resumed=resumed), first)
    return Verdict(name, False, f"{what}: every reported value matches, but the last checkpoint differs in the {part}")


def report(spec: JobSpec, steps: int, verdicts: Sequence[Verdict], only: Sequence[str] = SCENARIOS) -> str:
    lines = [f"clusterddp drill: {spec.script}, {spec.nodes} node(s) x {spec.tasks_per_node} rank(s), {steps} steps "
             "in the reference run"]
    for v in verdicts:
        lines.append(f"  {'PASS' if v.identical else 'FAIL'}  {v.scenario}: {v.why}")
    good = all(v.identical for v in verdicts)
    if good and spec.nodes == 1 and any(v.scenario.startswith("kill") for v in verdicts):
        lines.append("clusterddp drill: one node: the kill resumed from a checkpoint; a job of 2 or more nodes that "
                     "loses one resumes from the survivors' memory (peer heal), which --nodes 2 drills")
    if good and set(only) != set(SCENARIOS):  # a partial drill proves only what it ran
        lines.append(f"clusterddp drill: every scenario run ({', '.join(only)} only) bit-identical; drill without "
                     "--only to prove the rest")
    else:
        lines.append("clusterddp drill: every scenario bit-identical: the script resumes exactly" if good else
                     "clusterddp drill: fix the first difference above, then drill again")
    return "\n".join(lines)
