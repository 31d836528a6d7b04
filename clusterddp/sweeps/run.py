"""A sweep, start to end: the grid -> the trials without a result -> a snapshot of the code -> **one** job array ->
the sweep's record here; ``--rerun`` resubmits chosen trials from the record, with the code they were submitted with.
States and metrics come from status.py. The record lives under $XDG_STATE_HOME/clusterddp/sweeps/<cluster>/.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .. import dirs
from ..contract import PLACEHOLDERS
from ..datafiles import NotOwned, own_dir, own_run_dir, read_json, write_atomic
from ..errors import ClusterDDPError, PreflightError, SpecError
from ..job.clusters import Cluster
from ..job.code import code_files, code_hash, leaves
from ..job.quoting import shown
from ..job.spec import JobSpec
from .grid import Axis, Trial, check_placeholders, check_sweep_name, job_array, trials

LOCAL_RECORDS = ".local"             # the record directory of sweeps run with --local
Note = Callable[[str], None]


@dataclass
class SweepRecord:
    """What this machine keeps of a sweep: where its trials run, how (the job spec), every trial ever planned (by
    key) and every submission (array job id -> task index -> trial key)."""

    name: str
    cluster: str
    sweep_dir: str                    # absolute, on the cluster: the trials' run directories
    spec: Dict[str, Any]              # JobSpec fields (no sweep), as last submitted
    trials: Dict[str, Dict[str, Any]] = field(default_factory=dict)   # key -> index, params, code, script
    submissions: List[Dict[str, Any]] = field(default_factory=list)   # job_id, tasks {index: key}, time
    submitted_from: str = ""          # the directory the jobs run in (here): reruns start from there too
    origin: str = "sweep"             # or "map_array" (the Python API), which reruns by being called again

    @staticmethod
    def path(cluster: str, name: str) -> Path:
        return dirs.sweeps() / cluster / f"{check_sweep_name(name)}.json"

    def save(self) -> None:
        write_atomic(self.path(self.cluster, self.name), json.dumps(dataclasses.asdict(self), indent=1, sort_keys=True))

    @classmethod
    def load(cls, name: str, cluster: Optional[str] = None) -> "SweepRecord":
        """The record of sweep ``name`` (of ``cluster``, or of the one cluster that has a sweep of that name)."""
        check_sweep_name(name)
        root = dirs.sweeps()
        places = [cluster] if cluster else sorted(p.name for p in root.iterdir()) if root.is_dir() else []
        found = [c for c in places if cls.path(c, name).is_file()]
        if not found:
            known = sorted({p.stem for p in root.glob("*/*.json")}) if root.is_dir() else []
            raise SpecError(f"no sweep named {name!r}{f' on cluster {cluster}' if cluster else ''} was submitted from "
                            f"this machine" + (f"; known sweeps: {', '.join(known)}" if known else ""))
        if len(found) > 1:
            raise SpecError(f"sweep {name!r} exists for several clusters ({', '.join(found)}): choose one with "
                            "--cluster NAME (--local runs: --local)")
        return cls.read(cls.path(found[0], name))

    @classmethod
    def read(cls, path: Path) -> "SweepRecord":
        """A record file as data: bounded, this user's, every field of its type; a damaged one is one line."""
        try:
            info = os.lstat(path)
        except OSError as exc:
            raise ClusterDDPError(f"cannot read the sweep record {path}: {exc.strerror}") from None
        data = read_json(path, 64 << 20) if info.st_uid == os.getuid() else None
        bad = "not this user's file" if info.st_uid != os.getuid() else _damage(data)
        if bad is not None or not isinstance(data, dict):
            raise ClusterDDPError(f"the sweep record {path} is damaged ({bad}): move it aside and submit the sweep "
                                 "again (its trials with a result are found again)")
        return cls(**{f.name: data[f.name] for f in dataclasses.fields(cls) if f.name in data})

    def job_spec(self) -> JobSpec:
        return JobSpec(**self.spec)

    def trial(self, key: str) -> Trial:
        t = self.trials[key]
        return Trial(int(t["index"]), tuple((k, v) for k, v in t["params"]), key)


def _damage(data: Any) -> Optional[str]:
    """What is wrong with a sweep record's data, or None."""
    if not isinstance(data, dict):
        return "not a JSON object"
    types = {"name": str, "cluster": str, "sweep_dir": str, "spec": dict, "trials": dict, "submissions": list,
             "submitted_from": str, "origin": str}
    missing = [k for k in ("name", "cluster", "sweep_dir", "spec") if k not in data]
    if missing:
        return f"no {missing[0]!r}"
    wrong = [f"{k!r} is not a {t.__name__}" for k, t in types.items() if k in data and not isinstance(data[k], t)]
    if wrong:
        return wrong[0]
    if not all(isinstance(t, dict) and isinstance(t.get("index"), int) and isinstance(t.get("params"), list)
               and all(isinstance(kv, list) and len(kv) == 2 for kv in t["params"])
               for t in data.get("trials", {}).values()):
        return "a trial is not an index with its parameters"
    if not all(isinstance(s, dict) and isinstance(s.get("job_id"), str) and isinstance(s.get("tasks"), dict)
               and all(isinstance(k, str) and isinstance(v, str) for k, v in s["tasks"].items())
               for s in data.get("submissions", [])):
        return "a submission is not a job id with its tasks"
    return None


class RecordLock:
    """One sweep record's writers, one at a time (a second `clusterddp sweep` of the same name waits, then finds
    the first one's trials queued): an flock on a file beside the record, in this user's state directory."""

    def __init__(self, cluster: str, name: str) -> None:
        self.path = SweepRecord.path(cluster, name).with_suffix(".lock")
        self.fd: Optional[int] = None

    def __enter__(self) -> "RecordLock":
        import fcntl

        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # (closing drops the lock)
            self.fd = None

    def __exit__(self, *exc: object) -> None:
        self.release()


def spec_fields(spec: JobSpec) -> Dict[str, Any]:
    return {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec) if f.name != "sweep"}


def snapshot(cwd: Path, names: Sequence[str], target: Path) -> Path:
    """A private copy of the code at ``target`` (made once per code version: it is the same code). The sweep's
    directory and its code/ are this user's own (datafiles.own_dir), below directories nobody else can change
    (datafiles.own_run_dir's whole-path rule), and a snapshot found there is used only when it still holds the code
    its name (the code's hash) says: a copy run as the user is never one someone changed."""
    try:
        try:
            own_run_dir(target.parent.parent)
        except NotOwned as exc:
            raise NotOwned(f"the sweep directory {target.parent.parent} is not yours alone ({exc})") from None
        own_dir(target.parent)
        if os.path.lexists(target):
            own_dir(target)
            found = sorted(str(f.relative_to(target)) for f in target.rglob("*") if f.is_file() or f.is_symlink())
            if found != sorted(names) or code_hash(target, found) != target.name:
                raise NotOwned(f"the code snapshot {target} no longer holds the code it was made from (changed "
                               "since): remove it, then submit again")
            return target
    except NotOwned as exc:
        raise PreflightError(f"sweep: {exc}") from None
    old = os.umask(0o077)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        for name in names:
            src, dst = cwd / name, tmp / name
            dst.parent.mkdir(parents=True, exist_ok=True)
            if src.is_symlink() and not leaves(cwd, name):
                os.symlink(os.readlink(src), dst)
            elif src.is_file():  # (a link that leads out of the project: its target, copied)
                shutil.copy2(src, dst)
        tmp.rename(target)
    finally:
        os.umask(old)
        shutil.rmtree(tmp, ignore_errors=True)
    return target


# --- planning and submitting --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Plan:
    name: str
    spec: JobSpec          # as the user gave it (relative script, their output directory)
    trials: Tuple[Trial, ...]
    code: str
    names: Tuple[str, ...]


def plan(spec: JobSpec, axes: Sequence[Axis], name: Optional[str], cwd: Path) -> Plan:
    """Validate the sweep and compute every trial's key (pure but for reading the code)."""
    if spec.array is not None:
        raise SpecError("--array and a sweep both make the job array: drop --array (--max-parallel throttles)")
    if spec.after:
        raise SpecError("--after is not supported for sweeps yet: submit the sweep once its dependency is done")
    name = check_sweep_name(name or spec.file_stem)
    check_placeholders(spec.args, axes, spec.launcher)
    names = code_files(spec, cwd)
    if not spec.module and os.path.normpath(spec.script) not in names:
        raise SpecError(f"the training script {shown(spec.script)} is not among the files of {cwd} that a sweep "
                        "snapshots (outside it, or ignored by .gitignore): submit from the project's directory")
    code = code_hash(cwd, names)
    identity = {"script": spec.script, "module": spec.module, "args": list(spec.args), "code": code,
                "shape": [spec.nodes, spec.tasks_per_node, spec.launcher]}
    planned = trials(axes, identity)
    if spec.launcher == "spawn":
        # The spawn launcher fills its placeholders after the sweep filled its values: a placeholder that a value
        # holds, or that values put side by side compose ("{master" + "_port}"), would be filled in again.
        token = re.compile(r"\{(" + "|".join(map(re.escape, PLACEHOLDERS)) + r")\}")
        for t in planned:
            for written, filled in zip(spec.args, t.args(spec.args)):
                if len(token.findall(filled)) > len(token.findall(written)):
                    raise SpecError(f"trial {t.index} ({', '.join(f'{n}={v}' for n, v in t.params)}): the argument "
                                    f"{shown(written)} becomes {shown(filled)}, which holds a spawn placeholder "
                                    "the spawn launcher would fill in again: choose other values")
    return Plan(name, spec, tuple(planned), code, tuple(names))


def check_array_size(todo: Sequence[Trial], total: int, cluster: Cluster) -> None:
    """Refuse an array whose task ids reach the cluster's MaxArraySize (sbatch's own refusal is terse)."""
    from .. import backends

    limit = backends.get(cluster).max_array_size()
    if limit is not None and todo and max(t.index for t in todo) >= limit:
        raise PreflightError(f"the sweep has {total} trials (array task ids 0-{total - 1}), but this cluster's "
                             f"MaxArraySize is {limit} (task ids below {limit}): split the grid into sweeps of at "
                             f"most {limit} trials, or ask the admins to raise MaxArraySize")


def sweep_dir_for(spec: JobSpec, name: str, remote: bool) -> str:
    out = spec.output_dir if remote else str(Path(spec.output_dir).resolve())
    return f"{out.rstrip('/')}/sweep-{name}"


def submit(p: Plan, cluster: Cluster, todo: Sequence[Trial], record: SweepRecord, max_parallel: Optional[int],
           template_dirs: Sequence[str], check: bool, note: Note, cwd: Path) -> str:
    """One job array of ``todo`` (their original indices as task ids); returns its job id."""
    from .. import backends

    tasks = job_array(p.name, todo, p.spec.args)
    spec = p.spec.replace(output_dir=record.sweep_dir, sweep=tasks, array=tasks.indices(max_parallel))
    # The array script's size first (Slurm's max_script_size): nothing is made for a sweep sbatch would refuse.
    backends.get(cluster).script(spec, template_dirs)
    files_here = backends.host_for(cluster).files_here
    if files_here:  # here: the job runs the snapshot's script, from the directory submitted from
        code_dir = snapshot(cwd, p.names, Path(record.sweep_dir) / "code" / p.code)
        note(f"the sweep's trials run the code as it is now, from its snapshot {code_dir}")
        if not spec.module:
            spec = spec.replace(script=str(code_dir / spec.script))
    rec = backends.get(cluster).submit(spec, template_dirs, check=check, note=note)
    if not files_here:  # where the outputs went there (under the project's copy): absolute from now on
        record.sweep_dir = os.path.dirname(rec.run_dir)
    for t in todo:
        record.trials[t.key] = {"index": t.index, "params": [list(kv) for kv in t.params], "code": p.code}
    record.submissions.append({"job_id": rec.job_id, "time": int(time.time()),
                               "tasks": {str(t.index): t.key for t in todo}})
    record.spec = spec_fields(p.spec)
    record.save()
    return rec.job_id


def new_record(p: Plan, cluster: Cluster, local: bool) -> SweepRecord:
    from .. import backends

    where = LOCAL_RECORDS if local else cluster.name
    try:
        old = SweepRecord.load(p.name, where)
    except SpecError:
        elsewhere = not local and not backends.host_for(cluster).files_here  # its outputs under the copy there
        return SweepRecord(p.name, where, sweep_dir_for(p.spec, p.name, elsewhere),
                           spec_fields(p.spec), submitted_from=str(Path.cwd()))
    if old.spec.get("output_dir") != p.spec.output_dir or old.submitted_from != str(Path.cwd()):
        raise SpecError(f"sweep {p.name!r} was submitted from {old.submitted_from} with --output-dir "
                        f"{old.spec.get('output_dir')}: submit it from there with the same --output-dir, or give "
                        "this one another --name")
    return old
