"""A remote job's files, readable here: its logs and reports copied back from the cluster (only what changed;
never checkpoints or data; no symbolic link followed) into this machine's mirror directory."""
from __future__ import annotations

import hashlib
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from ... import dirs
from ...job.clusters import Cluster
from ...job.ids import HERE
from .connection import host_path, rsync

if TYPE_CHECKING:
    from ..record import JobRecord

#: What is copied back from a run directory: logs and reports (the step telemetry and the metrics included, for
#: `top`, `report` and the goodput line), never checkpoints or data.
PULL_FILTER = ["--include=*/", "--include=*.out", "--include=*.txt", "--include=*.json", "--include=*.log",
               "--include=*.tsv", "--include=rank_*", "--include=*.pos", "--include=*.jsonl", "--exclude=*"]
#: How a run directory comes back: recursive, times kept, symlinks skipped (no -l), empty directories left out.
PULL_ARGS = ["-rt", "--no-links", "--prune-empty-dirs", *PULL_FILTER]


def _mirror(cluster_name: str, leaf: str) -> Path:
    """A directory on this machine for copies of one remote job's files."""
    local = dirs.mirror() / cluster_name / leaf
    local.mkdir(parents=True, exist_ok=True)
    return local


def mirror_dir(record: "JobRecord") -> Path:
    """Where a remote job's logs and reports are copied back to on this machine (one per submission: a reused id
    gets its own)."""
    key = hashlib.sha256(record.script_path.encode()).hexdigest()[:8]
    return _mirror(record.cluster, f"{record.job_id}-{key}")


def fetch(record: "JobRecord") -> "JobRecord":
    """The record with its files readable here: for a remote job, its batch log and its run directory's logs and
    reports copied back (only what changed) and the paths pointing at the copies; a job of ``here`` as it is."""
    from ...job.clusters import by_name

    if record.cluster in ("", HERE):
        return record
    cluster = by_name(record.cluster)
    local = mirror_dir(record)
    run_name = Path(record.run_dir).name
    # -rt, not -l: links in a remote run directory are not copied (one planted there could name any file of
    # yours once it is followed here: logs --rank printed ~/.ssh/id_ed25519 that way).
    rsync(cluster, [*PULL_ARGS, "--",
                     host_path(cluster, record.batch_log), host_path(cluster, record.run_dir),
                     f"{local}/"], f"job {record.job_id}'s logs")
    return replace(record, batch_log=str(local / Path(record.batch_log).name), run_dir=str(local / run_name),
                   script_path=record.script_path)


#: What `status` needs of an ended job: the roll call, the rendezvous report, the attempts and their step telemetry
#: (for the goodput line), nothing else.
REPORT_FILTER = ["--include=/*/", "--include=/*/stacks/", "--include=/*/stacks/hang-*/",
                 "--include=/*/stacks/hang-*/rollcall.*", "--include=/*/stacks/rendezvous-*.txt",
                 "--include=/*/attempts.tsv", "--include=/*/telemetry/", "--include=/*/telemetry/restart-*/",
                 "--include=/*/telemetry/restart-*/rank-*.*", "--include=/*/attempts/",
                 "--include=/*/attempts/*/", "--include=/*/attempts/*/telemetry/",
                 "--include=/*/attempts/*/telemetry/restart-*/", "--include=/*/attempts/*/telemetry/restart-*/rank-*.*",
                 "--exclude=*"]
_FINAL = ".reports-final"


def fetch_reports(record: "JobRecord") -> "JobRecord":
    """Like fetch, for `status` of an ended job: only its report files, copied once (an ended job's reports do not
    change; a listing of many finished jobs then costs no copy at all)."""
    from ...job.clusters import by_name

    if record.cluster in ("", HERE):
        return record
    local = mirror_dir(record)
    run_name = Path(record.run_dir).name
    marker = local / _FINAL
    if not marker.exists():
        cluster = by_name(record.cluster)
        rsync(cluster, ["-rt", "--no-links", "--prune-empty-dirs", *REPORT_FILTER, "--",
                         host_path(cluster, record.run_dir), f"{local}/"], f"job {record.job_id}'s reports")
        marker.write_text("")
    return replace(record, batch_log=str(local / Path(record.batch_log).name), run_dir=str(local / run_name))


def fetch_file(cluster: Cluster, path: str, job_id: str) -> Path:
    """One file from the cluster (a log Slurm names), copied here."""
    local = _mirror(cluster.name, f"{job_id}-log")
    rsync(cluster, ["-t", "--no-links", "--", host_path(cluster, path), f"{local}/"], f"job {job_id}'s log")
    return local / Path(path).name


def fetch_tree(cluster: Cluster, path: str, name: str, files: Sequence[str]) -> Path:
    """The files named ``files`` (names, not paths) of each directory under ``path`` on the cluster, copied here
    (only what changed; no link followed) into a mirror directory named ``name``."""
    local = _mirror(cluster.name, name)
    rsync(cluster, ["-rt", "--no-links", "--prune-empty-dirs", "--include=/*/", *(f"--include=/*/{f}" for f in files),
                    "--exclude=*", "--", host_path(cluster, path.rstrip("/") + "/"), f"{local}/"], f"{name}'s files")
    return local
