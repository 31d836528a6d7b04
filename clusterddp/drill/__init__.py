"""`clusterddp drill`: prove on this machine that a training script survives preemption and node loss.

The same job (the local backend, emulated nodes) runs several times, each scenario in a directory of its own:
the reference, uninterrupted; node 0's ranks SIGKILLed after the first checkpoint and retried on a spare (every rank
starts again: another node says no more of the script; every_node kills each), then, in the same job, stopped at a
step the drill chooses (should_stop() answers True there, as at a time limit) and started again (where that job
differs from the reference, each scenario runs alone). Each rank records its steps, the
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
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .. import contract
from ..backends.local.tree import end_run, ranks_of_node  # (and plan.visible_gpus, on use)
from ..datafiles import parse_json
from ..errors import ClusterDDPError
from ..job.spec import JobSpec
from .verdicts import Run, Verdict, compare, failed_run, resumes, stopped_at
from .verdicts import report as report  # (the CLI's)

SCENARIOS = contract.DRILL_SCENARIOS
STOP_AFTER_RESUME = "+2"  # (runtime/drill.py: the 2nd should_stop() of a process that resumed)


def checkpoint_flag(script: Path) -> str:
    """The script's own option for how often it checkpoints (``--ckpt-every``, ``--save-interval``), from its argparse
    lines; '' when it has none that says so."""
    text = script.read_text(encoding="utf-8", errors="replace")[:1_000_000] if script.is_file() else ""
    return next((f for f in re.findall(r"add_argument\(\s*['\"](--[A-Za-z0-9_-]+)['\"]", text)
                 if re.search(r"ckpt|checkpoint|save", f) and re.search(r"every|interval|freq|steps|period", f)), "")


def kill_name(node: Optional[int]) -> str:
    """A node-kill scenario's name (its directory and its verdict's)."""
    return f"kill-node{node}" if node is not None else "kill"


class DrillError(ClusterDDPError):
    """The script cannot be drilled as it is (one line saying what the drill needs)."""


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

    def run(self, scenario: str, part: str, spec: JobSpec, stop_at: Optional[Any] = None,
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
        if steps < 3 or saves[0]["n"] + 2 > steps:  # (the kill comes at the 2nd should_stop() after the save)
            flag = checkpoint_flag(Path(self.spec.script))
            earlier = (f"checkpoint earlier (this script's {flag}, e.g. after -- add {flag} {max(1, steps // 4)})"
                       if flag and steps >= 3 else "checkpoint earlier")
            raise DrillError(f"the script ran {steps} step(s) (should_stop() calls) and saved its first checkpoint at "
                             f"step {saves[0]['step']}: the drill stops a run 2 steps after its first checkpoint, "
                             f"before its end; give it more steps (a short epoch) or {earlier}")
        if not all(self._in_reference(e["path"]) for e in saves):
            raise DrillError(f"the script writes its checkpoints outside the directory it runs in ({saves[0]['path']}):"
                             " each scenario runs in a directory of its own, so keep them under $CLUSTERDDP_RUN_DIR "
                             "(the run directory: a requeued or retried job keeps it, each sweep trial has its own; "
                             "a fixed directory would be shared by every trial of a sweep)")
        return ref, steps

    def all(self, only: Sequence[str] = SCENARIOS) -> Tuple[int, List[Verdict]]:
        """The reference's steps and each scenario's verdict (kinds in ``only``), in order. The node kills need the
        reference only to be compared: where there is room (a directory each) they run beside it. The stop rides
        on node 0's kill, later in the same job (as a job may lose a node, then meet its time limit): one job's
        runs for two scenarios; where that job differs from the reference, each runs alone to name the cause."""
        kills = [] if "kill" not in only else [None] if self.spec.nodes < 2 else \
            [*range(self.spec.nodes - 1, -1, -1)] if self.every_node else [0]
        paired = "stop" in only and bool(kills)
        stops = [paired and node == kills[-1] for node in kills]
        beside = self.side_by_side(len(kills) + 1 + ("stop" in only and not paired))
        pool = ThreadPoolExecutor(max(1, len(kills) + 1), thread_name_prefix="drill")
        ended = threading.Event()  # the reference ended (its checks next)
        try:  # (a failure or Ctrl-C: the runs beside end too)
            killed = [pool.submit(self._kill_beside, node, ended, stop) for node, stop in zip(kills, stops)] \
                if beside else []
            try:
                ref, steps = self.reference()
            finally:
                ended.set()
            self.note(f"clusterddp drill: {steps} steps; now the interruptions ...")
            alone = "stop" in only and not paired
            stop = pool.submit(self._stop, ref, steps) if beside and alone else None
            out = [stop.result() if stop else self._stop(ref, steps)] if alone else []
            runs = [f.result() or self._kill_runs(node, s) for f, node, s in zip(killed, kills, stops)] if beside \
                else [self._kill_runs(node, s) for node, s in zip(kills, stops)]
            for (node, made), s in zip(runs, stops):
                out.extend(self._paired(ref, steps, node, made) if s else [self._kill_verdict(ref, node, made)])
            return steps, sorted(out, key=lambda v: v.scenario != "stop")  # (the stop first, as it always came)
        except BaseException:
            self.abort.set()
            raise
        finally:
            pool.shutdown(wait=True)

    def side_by_side(self, n: int) -> bool:
        """Whether ``n`` runs may go at once: ranks on the CPU (they share the cores; the drill compares values,
        never times); runs on GPUs go one after another (each run takes the GPUs from the first: never shared)."""
        if n < 2 or os.environ.get(contract.DRILL_SERIAL, "") not in ("", "0"):
            return False
        if not self.spec.gpus_per_node:
            return True
        from ..backends.local.plan import visible_gpus

        return len(visible_gpus()) < self.spec.world_size  # (too few GPUs: every run on the CPU)

    def _stop(self, ref: Run, steps: int) -> Verdict:
        first_save = next(e["n"] for e in ref.events[0] if e["e"] == "save")
        stop_at = max(first_save + 1, steps // 2)
        a = self.run("stop", "a", self.spec, stop_at=stop_at)
        if a.code != 0:
            return Verdict("stop", False, f"the run stopped at step {stop_at} ended with exit {a.code}: after "
                           f"should_stop() is True the script saves and returns (see {a.log})")
        b = self.run("stop", "b", self.spec)
        what = f"stopped at step {stop_at} (the time-limit signal) and run again"
        return failed_run("stop", what, b) or compare("stop", what, ref, [a, b], stop_at)

    def _kill_beside(self, node: Optional[int], ended: threading.Event,
                     stop: bool) -> Optional[Tuple[Optional[int], List[Run]]]:
        """The kill's runs beside the reference from its first checkpoint on, where that lies in the reference's own
        directory (a script that writes elsewhere is refused by the reference's checks before any other run writes
        there); None where it did not start (then it runs after the reference)."""
        record = self.base / "reference" / "drill-a"
        while not ended.is_set() and not self.abort.is_set():
            saves = [e for e in _events(record).get(0, []) if e["e"] == "save"] if record.is_dir() else []
            if saves:
                return self._kill_runs(node, stop) if self._in_reference(saves[0]["path"]) else None
            time.sleep(0.1)
        return None

    def _in_reference(self, path: str) -> bool:
        return Path(path).resolve().is_relative_to((self.base / "reference").resolve())

    def _kill_runs(self, node: Optional[int], then_stop: bool = False) -> Tuple[Optional[int], List[Run]]:
        """The kill's runs; ``then_stop``: the job goes on to a stop at the second step after the kill's resume (in
        the process that resumed: none before the kill), and is then run again."""
        name = kill_name(node) + ("-then-stop" if then_stop else "")
        stop = STOP_AFTER_RESUME if then_stop else None
        if node is not None:
            spec = self.spec.replace(spare_nodes=max(1, self.spec.spare_nodes), retries=max(1, self.spec.retries))
            made = [self.run(name, "a", spec, stop_at=stop, kill_node=node)]
        else:
            spec = self.spec.replace(retries=0)  # one node: every rank killed, then the command run again
            made = [self.run(name, "a", spec, stop_at=stop, kill_node=0), self.run(name, "b", spec, stop_at=stop)]
        if stop is not None and stopped_at(made) is not None:
            made.append(self.run(name, "c", spec))
        return node, made

    def _paired(self, ref: Run, steps: int, node: Optional[int], runs: List[Run]) -> List[Verdict]:
        """The stop's and the kill's verdicts from one job's runs where all of it is right (the retry resumed, every
        run after the kill ended 0, every value and the last checkpoint as the reference's); else each scenario
        alone, and where each passes alone, the job that met both is a FAIL of its own, never hidden."""
        at = stopped_at(runs)
        if at is None:  # (the job ended before the stop's step: the stop alone)
            return [self._stop(ref, steps), self._kill_verdict(ref, node, runs)]
        kill = next((e["n"] for e in runs[0].events.get(0, []) if e["e"] == "save"), 0)
        name, what = f"{kill_name(node)}-then-stop", f"{self._kill_what(node)}, then stopped at step {at} and run again"
        whole = failed_run(name, what, runs[-1]) or compare(name, what, ref, runs, kill)
        stopped = runs[-2]  # (the run that met the stop: its exit counts too)
        if stopped.code:
            whole = Verdict(name, False, f"{what}: the run stopped at step {at} ended with exit {stopped.code} (see "
                                         f"{stopped.log})")
        elif not all(any(e["e"] == "load" and e.get("step") is not None for r in runs[:-1] for e in r.events.get(k, []))
                     for k in ref.events):
            whole = Verdict(name, False, f"{what}: the retry did not resume: started again at step 0")
        if whole.identical:
            # (the kill's part alone ends at the stop, its last checkpoint not the reference's: the whole job's is)
            return [Verdict("stop", True, f"stopped at step {at} (the time-limit signal) in the same job, after the "
                            "kill's resume, and run again: bit-identical"),
                    Verdict(kill_name(node), True, f"{self._kill_what(node)}: bit-identical{resumes(runs[:-1])}")]
        self.note("clusterddp drill: the job that lost a node, then stopped, differs from the reference; now each "
                  "alone, to name the cause ...")
        alone = [self._stop(ref, steps), self._kill_verdict(ref, node, self._kill_runs(node)[1])]
        return alone + ([whole._replace(why=whole.why + " (each alone is bit-identical: the two in one job are not)")]
                        if all(v.identical for v in alone) else [])

    def _kill_verdict(self, ref: Run, node: Optional[int], runs: List[Run]) -> Verdict:
        name = kill_name(node)
        kill = next((e["n"] for e in runs[0].events.get(0, []) if e["e"] == "save"), 0)
        what = self._kill_what(node)
        verdict = failed_run(name, what, runs[-1]) or compare(name, what, ref, runs, kill)
        return verdict._replace(why=verdict.why + resumes(runs)) if verdict.identical else verdict

    @staticmethod
    def _kill_what(node: Optional[int]) -> str:
        return (f"emulated node {node}'s ranks SIGKILLed a step after the first checkpoint, retried on a spare"
                if node is not None else "every rank SIGKILLed a step after the first checkpoint, run again")
