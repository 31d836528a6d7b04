"""The local record of submitted jobs, for ``logs`` and ``status`` after Slurm has forgotten a job, and the
cluster a job id belongs to (``for_job``)."""
from __future__ import annotations

import json
import stat
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, List, Mapping, Optional, Tuple

from .. import contract, dirs
from ..datafiles import read_json, write_atomic
from ..errors import SpecError
from ..job.clusters import HERE, Cluster, by_name, choose
from ..job.ids import LOCAL, is_local_job_id
from ..job.ids import check_any_job_id as check_job_id
from ..job.ids import check_cluster_name as check_name


def state_dir() -> Path:
    return dirs.jobs()


@dataclass
class JobRecord:
    job_id: str
    script_path: str
    batch_log: str
    run_dir: str
    launcher: str
    procs_per_node: int
    nodes: int
    cluster: str = HERE      # clusters.py: HERE or a [clusters.NAME]; paths above are on that cluster
    python: str = "python3"  # the job's interpreter (stacks runs its py-spy helper with it)

    def save(self) -> Path:
        """Write the record under its cluster; an older record of another job with the same id (a reset counter,
        a second cluster sharing $HOME) is kept beside it as <id>.json.<n>, never overwritten."""
        d = state_dir() / self.cluster
        d.mkdir(parents=True, exist_ok=True)
        path = d / f"{self.job_id}.json"
        old = JobRecord.load(self.job_id, self.cluster) if path.exists() else None
        if old is not None and old.script_path != self.script_path:
            n = 1
            while (d / f"{self.job_id}.json.{n}").exists():
                n += 1
            path.replace(d / f"{self.job_id}.json.{n}")
        write_atomic(path, json.dumps(asdict(self), indent=1))
        return path

    @classmethod
    def load(cls, job_id: str, cluster: str = HERE) -> Optional["JobRecord"]:
        """The record of ``job_id`` on ``cluster`` (records from before clusters existed count as ``here``)."""
        job_id = check_job_id(job_id)
        candidates = [state_dir() / check_name(cluster) / f"{job_id}.json"]
        if cluster == HERE:
            candidates.append(state_dir() / f"{job_id}.json")
        for path in candidates:
            data = read_json(path, 1 << 16)  # a record is data: no link followed, bounded, typed below
            if not _well_formed(data):
                continue
            data["cluster"] = cluster  # where it is filed says which cluster it belongs to
            return cls(**data)
        return None

    def rank_log(self, rank: int) -> Tuple[Path, Optional[str]]:
        """(path, line prefix or None) of one rank's output."""
        name, prefix = contract.LAUNCHERS[self.launcher].log(rank, self.procs_per_node)
        return Path(self.run_dir) / name, prefix

    def logs(self) -> List[Path]:
        run_dir = Path(self.run_dir)
        return sorted(run_dir.glob("rank-*.out")) + sorted(run_dir.glob("node-*.out"))


_FIELDS = {"job_id", "script_path", "batch_log", "run_dir", "launcher", "procs_per_node", "nodes", "cluster", "python"}


def _well_formed(data: object) -> bool:
    texts = ("job_id", "script_path", "batch_log", "run_dir", "launcher")
    return isinstance(data, dict) and not set(data) - _FIELDS and all(isinstance(data.get(k), str) for k in texts) \
        and all(isinstance(data.get(k), int) and 0 < data[k] < 1 << 20 for k in ("procs_per_node", "nodes")) \
        and isinstance(data.get("python", ""), str) and data.get("launcher") in contract.LAUNCHERS


def clusters_of(job_id: str) -> List[str]:
    """The clusters whose records here hold ``job_id`` (sorted; records from before clusters existed: ``here``)."""
    names = {f"{check_job_id(job_id)}.json", f"{job_id.split('_')[0]}.json"}  # an array task: its job's record
    base = state_dir()
    found = {d.name for d in (base.iterdir() if base.is_dir() else ()) for n in names if (d / n).is_file()}
    if any((base / n).is_file() for n in names):
        found.add(HERE)
    return sorted(found)


def recent(limit: int = 10) -> List[JobRecord]:
    """The last ``limit`` jobs recorded here, of every cluster, oldest first."""
    paths = []
    for path in list(state_dir().glob("*/*.json")) + list(state_dir().glob("*.json")):
        try:
            st = path.lstat()
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):  # a link (dangling or not) is not a record of ours
            paths.append((st.st_mtime, path))
    out = []
    for _, path in sorted(paths)[-limit:]:
        cluster = path.parent.name if path.parent != state_dir() else HERE
        try:
            record = JobRecord.load(path.stem, cluster)
        except ValueError:  # a file that is not a record of ours
            continue
        if record is not None:
            out.append(record)
    return out


def for_job(job_id: str, option: Optional[str], environ: Optional[Mapping[str, str]] = None,
            note: Optional[Callable[[str], None]] = None) -> Cluster:
    """The cluster of a job id: --cluster when given; else the one cluster whose records hold the id (``note`` is
    told when it is not this machine's Slurm); several -> refused, naming them; none -> the configured default.
    A job submitted to a remote cluster is never looked up in this machine's own Slurm (another job there may
    have the same id)."""
    if is_local_job_id(job_id):  # a local run's (L7): this machine, whatever the default cluster
        if option:
            raise SpecError(f"{job_id} is a local run's id (clusterddp submit --local): --cluster does not apply")
        return by_name(LOCAL)
    if option:
        return choose(option, environ=environ)
    found = clusters_of(job_id)
    if len(found) > 1:
        raise SpecError(f"job {job_id} is recorded on several clusters ({', '.join(found)}): choose one with "
                        f"--cluster NAME, e.g. --cluster {found[0]}")
    if not found:
        return choose(None, environ=environ)
    if found[0] != HERE and note is not None:
        note(f"job {job_id} is on cluster {found[0]} (from clusterddp's record of it; --cluster chooses another)")
    return by_name(found[0], environ)


Located = Tuple[Optional[str], Path, Optional[JobRecord], Optional[Cluster]]


def locate(job: str, option: Optional[str], command: str, note: Optional[Callable[[str], None]] = None) -> Located:
    """JOB as ``stacks``, ``top`` and ``report`` take it: a job id submitted from here (its record gives the run
    directory), a local run's id (L7) or its run directory (no id, no record). Returns the job id, the run directory,
    the record and the cluster (None for a run directory)."""
    try:
        job_id: Optional[str] = check_job_id(job)
    except SpecError:
        job_id = None
    if job_id is None:
        if not Path(job).is_dir():
            raise SpecError(f"{job!r} is neither a job id (1234, or a local run's L7) nor an existing run directory")
        return None, Path(job), None, None
    chosen = for_job(job_id, option, note=note)
    record = JobRecord.load(job_id, chosen.name)
    if record is None and is_local_job_id(job_id):
        raise SpecError(f"no local run {job_id} here (clusterddp status lists the recent ones)")
    if record is None:
        raise SpecError(f"job {job_id} was not submitted with clusterddp here, so its run directory is unknown; "
                        f"pass the run directory instead: clusterddp {command} RUN_DIR")
    return job_id, Path(record.run_dir), record, chosen
