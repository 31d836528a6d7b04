"""`clusterddp drill`: prove on this machine that a training script survives preemption and node loss.

The same job (the local backend, emulated nodes) runs several times, each scenario in a directory of its own:
the reference, uninterrupted; stopped at a step the drill chooses (should_stop() answers True there, as at a time
limit) and started again; node 0's ranks SIGKILLed after the first checkpoint and retried on a spare (every rank
starts again: another node says no more of the script; every_node kills each). Each rank records its steps, the
values it reported (all_reduce_mean) and its checkpoints (runtime/drill.py); the drill compares them with the
reference step by step and the last checkpoints tensor by tensor, and names the first difference.
Login side: it never imports torch itself except to read checkpoints (weights_only).
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

from .. import contract
from ..backends.local.tree import end_run, ranks_of_node  # (and plan.visible_gpus, on use)
from ..datafiles import parse_json
from ..errors import ClusterDDPError
from ..job.spec import JobSpec
from .check import component

OUTSIDE = ("everything the checkpoint holds was restored, yet the run differs at step {step} (resumed from step "
           "{resumed}): state outside the checkpoint (an LR scheduler, a GradScaler, an EMA model, a counter, your own "
           "random generator)")
SCENARIOS = contract.DRILL_SCENARIOS


def checkpoint_flag(script: Path) -> str:
    """The script's own option for how often it checkpoints (``--ckpt-every``, ``--save-interval``), from its argparse
    lines; '' when it has none that says so."""
    text = script.read_text(encoding="utf-8", errors="replace")[:1_000_000] if script.is_file() else ""
    return next((f for f in re.findall(r"add_argument\(\s*['\"](--[A-Za-z0-9_-]+)['\"]", text)
                 if re.search(r"ckpt|checkpoint|save", f) and re.search(r"every|interval|freq|steps|period", f)), "")


class DrillError(ClusterDDPError):
    """The script cannot be drilled as it is (one line saying what the drill needs)."""


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


def _child() -> None:
    """In the drill's child process: one local run of the spec given as JSON on stdin."""
    from .. import backends
    from ..job.ids import LOCAL

    sent = json.load(sys.stdin)
    given = tuple((name, os.environ[name]) for name in contract.DRILL_VARIABLES if name in os.environ)
    sys.exit(backends.get(LOCAL).run(JobSpec(**sent["spec"]), quiet=False, drill_env=given, run_dir=sent["run_dir"]))


def _events(directory: Path) -> Dict[int, List[dict]]:
    out: Dict[int, List[dict]] = {}
    for path in sorted(directory.glob("rank-*.jsonl")):
        rank = int(path.stem.split("-")[1])
        events = []
        for line in path.read_text().split("\n"):
            try:
                event = parse_json(line) if line.strip() else None
            except ValueError:
                continue  # (a record cut short by a kill)
            if isinstance(event, dict) and isinstance(event.get("e"), str):
                events.append(event)
        out[rank] = events
    return out


def drill_base(parent: Path, stem: str) -> Path:
    """A new directory of this drill's own under ``parent`` (which may be shared): named with the time and a part
    nobody can predict, made exclusively, private: two drills in one second never share one, and nothing planted
    there in advance (a link where a log will be opened) can exist."""
    import tempfile

    try:
        parent.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}-", dir=parent))
    except OSError as exc:
        raise DrillError(f"cannot make the drill's directory in {parent}: {exc.strerror or exc}") from None


class Drill:
    def __init__(self, spec: JobSpec, base: Path, timeout_s: float, note: Any = print,
                 every_node: bool = False) -> None:
        if not spec.module:
            spec = spec.replace(script=str(Path(spec.script).resolve()))
        self.spec, self.base, self.timeout_s, self.note, self.every_node = spec, base, timeout_s, note, every_node
        self.abort = threading.Event()  # a scenario beside this one failed, or Ctrl-C: end the runs still going

    def run(self, scenario: str, part: str, spec: JobSpec, stop_at: Optional[int] = None,
            kill_node: Optional[int] = None) -> Run:
        """One local run in the scenario's directory (its cwd: relative checkpoint paths stay apart), in the
        scenario's one run directory (kept across its runs, as a requeued or retried job keeps its own)."""
        where = self.base / scenario
        record = where / f"drill-{part}"
        record.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, **{contract.DRILL_DIR: str(record)})
        env.pop(contract.DRILL_STOP_AT, None)
        if stop_at is not None:
            env[contract.DRILL_STOP_AT] = str(stop_at)
        fields = dataclasses.asdict(spec.replace(output_dir=str(where / "runs")))
        log = where / f"{part}.log"
        hold = record / contract.DRILL_HOLD
        if kill_node is not None:
            hold.touch()
        with open(log, "wb") as out:
            proc = subprocess.Popen([sys.executable, "-c", "from clusterddp.drill import _child; _child()"],
                                    cwd=where, env=env, stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            assert proc.stdin is not None
            proc.stdin.write(json.dumps({"spec": fields, "run_dir": str(where / "runs" / "job")}).encode())
            proc.stdin.close()
            deadline = time.monotonic() + self.timeout_s
            killed = kill_node is None
            try:
                while proc.poll() is None:
                    if self.abort.is_set():
                        end_run(proc)
                        raise DrillError(f"the {scenario} run ({part}) was ended: the drill stopped")
                    if time.monotonic() > deadline:
                        end_run(proc)
                        raise DrillError(f"the {scenario} run ({part}) did not end within {self.timeout_s:.0f} s "
                                         f"(--run-timeout); its output: {log}")
                    if not killed and len(list(record.glob("held-rank-*"))) >= spec.world_size:
                        # Every rank waits after the first checkpoint: the node's ranks die there, then the rest go on.
                        for pid in ranks_of_node(proc.pid, kill_node, spec.tasks_per_node):  # type: ignore[arg-type]
                            os.kill(pid, signal.SIGKILL)
                        killed = True
                        hold.unlink()
                    time.sleep(0.05)
            except KeyboardInterrupt:  # Ctrl-C: the run and its ranks end with the drill, never orphaned
                end_run(proc)
                raise
            if hold.exists():
                hold.unlink()
                raise DrillError(f"the {scenario} run ({part}) ended before every rank reached should_stop() after its "
                                 f"first checkpoint, so no node could be killed there; its output: {log}")
        return Run(proc.returncode, _events(record), log)

    # --- the scenarios --------------------------------------------------------------------------------------
    def reference(self) -> Tuple[Run, int]:
        ref = self.run("reference", "a", self.spec)
        if ref.code != 0:
            raise DrillError(f"the script fails on its own in the reference run (exit {ref.code}), before any "
                             f"interruption: the drill needs a script that completes; its output: {ref.log}")
        zero = ref.events.get(0, [])
        steps = sum(1 for e in zero if e["e"] == "step")
        saves = [e for e in zero if e["e"] == "save"]
        if not saves:
            raise DrillError("the script saved no checkpoint through clusterddp.runtime.Checkpointer (ckpt.save(step, "
                             "model, optimizer, loader)): the drill compares the checkpoints it writes")
        if steps < 3 or saves[0]["n"] >= steps:
            flag = checkpoint_flag(Path(self.spec.script))
            earlier = (f"checkpoint earlier (this script's {flag}, e.g. after -- add {flag} {max(1, steps // 4)})"
                       if flag and steps >= 3 else "checkpoint earlier")
            raise DrillError(f"the script ran {steps} step(s) (should_stop() calls) and saved its first checkpoint at "
                             f"step {saves[0]['n']}: the drill stops a run after its first checkpoint and before its "
                             f"end; give it more steps (a short epoch) or {earlier}")
        where = (self.base / "reference").resolve()
        if not all(Path(e["path"]).resolve().is_relative_to(where) for e in saves):
            raise DrillError(f"the script writes its checkpoints outside the directory it runs in ({saves[0]['path']}):"
                             " each scenario runs in a directory of its own, so keep them under $CLUSTERDDP_RUN_DIR "
                             "(the run directory: a requeued or retried job keeps it, each sweep trial has its own; "
                             "a fixed directory would be shared by every trial of a sweep)")
        return ref, steps

    def scenarios(self, ref: Run, steps: int, only: Sequence[str] = SCENARIOS) -> List[Verdict]:
        """Each scenario's verdict (kinds in ``only``), in order; side by side where there is room (a dir each)."""
        tasks: List[Callable[[], Verdict]] = []
        tasks += [lambda: self._stop(ref, steps)] if "stop" in only else []
        if "kill" in only:
            nodes = [None] if self.spec.nodes < 2 else [*range(self.spec.nodes - 1, -1, -1)] if self.every_node else [0]
            tasks += [lambda node=node: self._kill(ref, node) for node in nodes]  # type: ignore[misc]
        if not self.side_by_side(len(tasks)):
            return [task() for task in tasks]
        pool = ThreadPoolExecutor(len(tasks), thread_name_prefix="drill")
        futures = [pool.submit(task) for task in tasks]  # (a failure or Ctrl-C below: the others' runs end too)
        try:
            return [f.result() for f in futures]
        except BaseException:
            self.abort.set()
            raise
        finally:
            pool.shutdown(wait=True)

    def side_by_side(self, n: int) -> bool:
        """Whether ``n`` scenarios may run at once: CPU ranks (they share the cores; the drill compares values,
        never times), or GPUs enough for every run's ranks (else one after another: runs never share a GPU)."""
        if n < 2 or os.environ.get(contract.DRILL_SERIAL, "") not in ("", "0"):
            return False
        if not self.spec.gpus_per_node:
            return True
        from ..backends.local.plan import visible_gpus

        gpus = len(visible_gpus())
        return gpus < self.spec.world_size or gpus >= n * self.spec.world_size  # (too few: every run on the CPU)

    def _stop(self, ref: Run, steps: int) -> Verdict:
        first_save = next(e["n"] for e in ref.events[0] if e["e"] == "save")
        stop_at = max(first_save + 1, steps // 2)
        a = self.run("stop", "a", self.spec, stop_at=stop_at)
        if a.code != 0:
            return Verdict("stop", False, f"the run stopped at step {stop_at} ended with exit {a.code}: after "
                           f"should_stop() is True the script saves and returns (see {a.log})")
        b = self.run("stop", "b", self.spec)
        what = f"stopped at step {stop_at} (the time-limit signal) and run again"
        return _failed("stop", what, b) or compare("stop", what, ref, [a, b], stop_at)

    def _kill(self, ref: Run, node: Optional[int]) -> Verdict:
        name = f"kill-node{node}" if node is not None else "kill"
        if node is not None:
            spec = self.spec.replace(spare_nodes=max(1, self.spec.spare_nodes), retries=max(1, self.spec.retries))
            runs = [self.run(name, "a", spec, kill_node=node)]
        else:  # one node: every rank killed, then the command run again
            spec = self.spec.replace(retries=0)
            runs = [self.run(name, "a", spec, kill_node=0), self.run(name, "b", spec)]
        kill = next((e["n"] for e in runs[0].events.get(0, []) if e["e"] == "save"), 0)
        what = (f"emulated node {node}'s ranks SIGKILLed a step after the first checkpoint, retried on a spare"
                if node is not None else "every rank SIGKILLed a step after the first checkpoint, run again")
        verdict = _failed(name, what, runs[-1]) or compare(name, what, ref, runs, kill)
        return verdict._replace(why=verdict.why + resumes(runs)) if verdict.identical else verdict


def resumes(runs: Sequence[Run]) -> str:
    """Where a scenario's runs resumed (rank 0's loads) and how many steps each redid: ' (resumed ...)'."""
    said, done, offset = [], 0, 0
    for e in [e for run in runs for e in run.events.get(0, [])]:
        if e["e"] == "load":
            if e.get("step") is not None and done:
                how = "from the survivors' memory (peer heal)" if e.get("peer") else "from its checkpoint"
                said.append(f"resumed {how} at step {e['step']}, {max(0, done - int(e['step']))} step(s) redone")
            offset = int(e.get("step") or 0) - int(e.get("n") or 0)
        elif e["e"] == "step":
            done = offset + int(e.get("n") or 0)
    return f" ({'; '.join(said)})" if said else ""


def _failed(name: str, what: str, last: Run) -> Optional[Verdict]:
    """The run that should have finished the job did not end well: whatever its files say, that is a FAIL (a
    resumed run that crashes after its last checkpoint would otherwise match the reference)."""
    if last.code == 0:
        return None
    return Verdict(name, False, f"{what}: the run that finishes the job ended with exit {last.code} (see {last.log})")


def _values(runs: Sequence[Run], rank: int) -> Tuple[Dict[int, List[list]], Optional[str]]:
    """Global step -> the values reported at it, over the runs of a scenario (a resumed run counts from the step
    it loaded); and why it did not resume, if it did not."""
    out: Dict[int, List[list]] = {}
    problem = None
    for run in runs:
        offset = 0
        for e in run.events.get(rank, []):
            if e["e"] == "load":  # a new process (a retry's too) counts its steps from 0: the step it loaded first
                offset = int(e.get("step") or 0) - e["n"]
            elif e["e"] == "value":  # reported during step n + 1 (n: the should_stop() calls before it)
                out.setdefault(offset + e["n"] + 1, []).append(e["v"])
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
            if any(v != expected[step][-1] for v in got[step]):
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
    if first is not None:
        resumed = loads[0]["step"] if loads else "?"
        return Verdict(name, False, f"{what}: " + OUTSIDE.format(step=first, resumed=resumed), first)
    return Verdict(name, False, f"{what}: every reported value matches, but the last checkpoint differs in the {part}")


def report(spec: JobSpec, steps: int, verdicts: Sequence[Verdict], only: Sequence[str] = SCENARIOS) -> str:
    lines = [f"clusterddp drill: {spec.script}, {spec.nodes} node(s) x {spec.tasks_per_node} rank(s), {steps} steps "
             "in the reference run"]
    for v in verdicts:
        lines.append(f"  {'PASS' if v.identical else 'FAIL'}  {v.scenario}: {v.why}")
    good = all(v.identical for v in verdicts)
    if good and set(only) != set(SCENARIOS):  # a partial drill proves only what it ran
        lines.append(f"clusterddp drill: every scenario run ({', '.join(only)} only) bit-identical; drill without "
                     "--only to prove the rest")
    else:
        lines.append("clusterddp drill: every scenario bit-identical: the script resumes exactly" if good else
                     "clusterddp drill: fix the first difference above, then drill again")
    return "\n".join(lines)
