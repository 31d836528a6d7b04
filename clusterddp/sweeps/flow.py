"""What `clusterddp sweep` does, for the CLI and the Python API alike: submit the trials of a grid that have no
result yet (as one job array, or one after another here with --local), and rerun chosen trials of a sweep."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence

from .. import contract
from ..backends.jobinfo import JobState
from ..errors import SpecError
from ..healing import attempts
from ..job.clusters import Cluster
from ..job.ids import HERE, LOCAL
from ..job.spec import JobSpec
from .grid import Axis, Trial, count, job_array
from .run import (
    LOCAL_RECORDS,
    Note,
    Plan,
    RecordLock,
    SweepRecord,
    check_array_size,
    new_record,
    plan,
    snapshot,
    spec_fields,
    submit,
)
from .status import states

RERUN_CHOICES = ("failed", "missing")


@dataclass(frozen=True)
class Outcome:
    name: str
    job_id: Optional[str]      # the array (None: nothing submitted; a local sweep: "local")
    submitted: List[Trial]
    skipped: int               # trials that have a result or are queued already
    exit_code: int = 0         # a local sweep: 1 when a trial failed


def run(spec: JobSpec, axes: Sequence[Axis], name: Optional[str], cluster: Cluster, max_parallel: Optional[int],
        template_dirs: Sequence[str] = (), check: bool = True, local: bool = False, note: Note = print,
        echo: Note = print) -> Outcome:
    """The grid's trials without a result or a place in the queue -> one job array (or local runs)."""
    if max_parallel is not None and max_parallel < 1:
        raise SpecError(f"--max-parallel must be at least 1, got {max_parallel}")
    cwd = Path.cwd()
    p = plan(spec, axes, name, cwd)
    # One writer of the record at a time: a second submission of the same sweep waits, then finds these trials.
    with RecordLock(LOCAL_RECORDS if local else cluster.name, p.name):
        record = new_record(p, cluster, local)
        known = {s.key: s for s in states(record)} if record.trials else {}
        todo = [t for t in p.trials if t.key not in known or not known[t.key].has_result]
        skipped = len(p.trials) - len(todo)
        if not todo:
            note(f"nothing to submit: all {len(p.trials)} trial(s) of sweep {p.name} with these parameters and this "
                 f"code have a result or are queued (clusterddp sweep status {p.name}; --rerun failed runs failed "
                 "ones again)")
            return Outcome(p.name, None, [], skipped)
        if skipped:
            note(f"{skipped} of {len(p.trials)} trial(s) already have a result or are queued: submitting the other "
                 f"{len(todo)}")
        if local:
            # (held to the end: a local trial running has no result yet, and a second run would start it again)
            return _run_local(p, record, todo, skipped, note, echo, cwd, max_parallel or 1)
        check_array_size(todo, count(axes), cluster)
        job_id = submit(p, cluster, todo, record, max_parallel, template_dirs, check, note, cwd)
    return Outcome(p.name, job_id, todo, skipped)


def rerun(name: str, which: Sequence[str], cluster: Optional[Cluster], max_parallel: Optional[int],
          template_dirs: Sequence[str] = (), check: bool = True, note: Note = print, local: bool = False,
          echo: Note = print) -> Outcome:
    """Resubmit the trials of sweep ``name`` in the chosen states (failed: ended without success; missing:
    submitted but never ran), as one array, with the code each was submitted with."""
    bad = [w for w in which if w not in RERUN_CHOICES]
    if bad or not which:
        raise SpecError(f"--rerun takes {' or '.join(RERUN_CHOICES)}, got {', '.join(bad) or 'nothing'}")
    found = SweepRecord.load(name, LOCAL_RECORDS if local else cluster.name if cluster else None)
    with RecordLock(found.cluster, name):  # read again under the lock: another submission may have just written it
        return _rerun(SweepRecord.load(name, found.cluster), which, max_parallel, template_dirs, check, note, echo)


def _rerun(record: SweepRecord, which: Sequence[str], max_parallel: Optional[int], template_dirs: Sequence[str],
           check: bool, note: Note, echo: Note) -> Outcome:
    name = record.name
    if record.origin != "sweep":
        raise SpecError(f"sweep {name} was submitted by clusterddp.map_array: rerun its configs by calling it again")
    wanted = {"failed": lambda s: s.state == JobState.FAILED, "missing": lambda s: s.state == JobState.MISSING}
    rows = [s for s in states(record) if any(wanted[w](s) for w in which)]
    if not rows:
        note(f"nothing to rerun: no trial of sweep {name} is {' or '.join(which)} (clusterddp sweep status {name})")
        return Outcome(name, None, [], 0)
    spec = record.job_spec()
    codes = {record.trials[s.key]["code"] for s in rows}
    if len(codes) > 1:
        raise SpecError(f"the trials to rerun ran {len(codes)} versions of the code; one array runs one: submit the "
                        "sweep again from the code you want instead")
    code = codes.pop()
    cwd = Path.cwd()
    if record.submitted_from and record.submitted_from != str(cwd):
        raise SpecError(f"sweep {name} was submitted from {record.submitted_from}: rerun it from there (its trials' "
                        "relative paths are relative to that directory)")
    snap = Path(record.sweep_dir) / "code" / code
    todo = [record.trial(s.key) for s in rows]
    if record.cluster in (LOCAL_RECORDS, HERE):
        if not snap.is_dir():
            raise SpecError(f"the code snapshot of these trials, {snap}, is gone: submit the sweep again instead")
        names = [str(f.relative_to(snap)) for f in snap.rglob("*") if f.is_file() or f.is_symlink()]
        p = Plan(name, spec, tuple(todo), code, tuple(names))
        if record.cluster == LOCAL_RECORDS:
            return _run_local(p, record, todo, 0, note, echo, snap, max_parallel or 1)
        return Outcome(name, submit(p, _cluster(record), todo, record, max_parallel, template_dirs, check, note,
                                    snap), todo, 0)
    from ..job.code import code_files, code_hash

    if code_hash(cwd, code_files(spec, cwd)) != code:
        raise SpecError(f"the code here differs from what the trials of sweep {name} were submitted with, and a "
                        f"remote cluster keeps only its own copy: restore that code to rerun them, or submit the "
                        f"sweep again (its trials with this code are new trials)")
    p = Plan(name, spec, tuple(todo), code, ())
    return Outcome(name, submit(p, _cluster(record), todo, record, max_parallel, template_dirs, check, note, cwd),
                   todo, 0)


def _cluster(record: SweepRecord) -> Cluster:
    from ..job.clusters import by_name

    return by_name(record.cluster)


def _run_local(p: Plan, record: SweepRecord, todo: Sequence[Trial], skipped: int, note: Note, echo: Note,
               cwd: Path, parallel: int = 1) -> Outcome:
    """The trials on this machine from the code's snapshot, each a full local DDP job: one after another (their
    output here), or ``parallel`` at once, each in a process of its own with its share of the CPUs and GPUs and
    its output in SWEEP_DIR/logs/trial-N.log."""
    from ..backends.local.plan import cpu_count, visible_gpus

    code_dir = snapshot(cwd, p.names, Path(record.sweep_dir) / "code" / p.code)
    spec = p.spec if p.spec.module else p.spec.replace(script=str(code_dir / p.spec.script))
    for t in todo:
        record.trials[t.key] = {"index": t.index, "params": [list(kv) for kv in t.params], "code": p.code}
    record.submissions.append({"job_id": LOCAL, "time": int(time.time()), "tasks": {}})
    record.save()
    parallel = max(1, min(parallel, len(todo)))
    if parallel > 1 and spec.cpus_per_task is None:  # the machine's CPUs shared, not each trial's alone
        spec = spec.replace(cpus_per_task=max(1, cpu_count() // (spec.world_size * parallel)))
    gpus = visible_gpus() if spec.gpus_per_node else []
    share = len(gpus) // parallel
    slots = list(range(parallel))
    running: List[tuple] = []
    failed, queue, started = 0, list(enumerate(todo, 1)), time.monotonic()
    logs = Path(record.sweep_dir) / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    try:
        while queue or running:
            while queue and slots:
                (n, t), slot = queue.pop(0), slots.pop(0)
                slice_ = gpus[slot * share:(slot + 1) * share] if spec.gpus_per_node and parallel > 1 else None
                proc, out = _start_trial(p, spec, record, t, f"{n} of {len(todo)}", slice_, parallel > 1, note)
                running.append((proc, t, slot, time.monotonic(), out))
            time.sleep(0.2)
            for item in [r for r in running if r[0].poll() is not None]:
                proc, t, slot, began, out = item
                running.remove(item)
                slots.append(slot)
                if out:
                    out.close()
                failed += proc.returncode != 0
                verdict = "COMPLETED" if proc.returncode == 0 else f"FAILED (exit {proc.returncode})"
                note(f"clusterddp sweep {p.name}: trial {t.index} {verdict} in {time.monotonic() - began:.0f} s")
    except KeyboardInterrupt:
        for proc, *_ in running:  # each trial stops its ranks on SIGINT, as a local run does on Ctrl-C
            proc.send_signal(signal.SIGINT)
        for proc, *_ in running:
            proc.wait()
        raise
    note(f"clusterddp sweep {p.name}: {len(todo)} trial(s) in {time.monotonic() - started:.0f} s, {failed} failed")
    return Outcome(p.name, LOCAL, list(todo), skipped, 1 if failed else 0)


def _start_trial(p: Plan, spec: JobSpec, record: SweepRecord, t: Trial, which: str, gpus: Optional[List[str]],
                 apart: bool, note: Note) -> tuple:
    """One local trial in a process of its own (``gpus``: its slice; ``apart``: its output in its log, in a
    session of its own); returns (process, its log file or None)."""
    trial_spec = spec.replace(output_dir=record.sweep_dir, args=tuple(t.args(spec.args)))
    env = dict(os.environ)
    if gpus is not None:  # a slice of the GPUs per slot (too few: CPU)
        env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
    log = Path(record.sweep_dir) / "logs" / f"trial-{t.index}.log"
    shown = " ".join(f"{k}={v}" for k, v in t.params)
    note(f"clusterddp sweep {p.name}: trial {t.index} ({which}): {shown}" + (f" (output: {log})" if apart else ""))
    out = open(log, "ab") if apart else None
    proc = subprocess.Popen([sys.executable, "-c", "from clusterddp.sweeps.flow import _child; _child()"],
                            env=env, stdin=subprocess.PIPE, stdout=out, stderr=out, start_new_session=apart)
    assert proc.stdin is not None
    proc.stdin.write(json.dumps({"fields": spec_fields(trial_spec), "sweep": p.name, "index": t.index,
                                 "params": t.params, "key": t.key, "args": spec.args}).encode())
    proc.stdin.close()
    return proc, out


def _child() -> None:
    """One local trial, in a process of its own (its spec and trial as JSON on stdin)."""
    from .. import backends

    data = json.load(sys.stdin)
    t = Trial(int(data["index"]), tuple((str(k), str(v)) for k, v in data["params"]), str(data["key"]))
    name = str(data["sweep"])
    # The task's arguments from the sweep's own ARGS: the fields' are filled in already (a value is never refilled).
    spec = JobSpec(**data["fields"]).replace(sweep=job_array(name, (t,), [str(a) for a in data["args"]]))
    start, made = int(time.time()), []

    def prepare(run_dir: str) -> None:
        made.append(_trial_file(Path(run_dir), name, t))

    code = backends.get(LOCAL).run(spec, quiet=True, note=lambda line: print(line, file=sys.stderr, flush=True),
                                   prepare=prepare)
    if made:
        ended(made[0], code, start)
    sys.exit(code)


def _trial_file(run_dir: Path, sweep: str, t: Trial) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / contract.TRIAL_FILE).write_text(json.dumps(t.record(sweep), sort_keys=True) + "\n")
    return run_dir


def ended(run_dir: Path, code: int, start: int) -> None:
    """A local trial's end in its attempts.tsv, where its retry loop wrote none (--retries 0)."""
    if not attempts.read(run_dir):
        attempts.append(run_dir, attempts.Attempt(0, 0, start, int(time.time()), ("local0",), code, "", (), "",
                                                  contract.NEXT_END))


__all__ = ["run", "rerun", "Outcome", "RERUN_CHOICES"]
