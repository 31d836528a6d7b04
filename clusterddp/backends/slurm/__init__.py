"""The Slurm backend: this machine's Slurm, or a cluster's over SSH (the host is chosen from the cluster)."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from ...job.clusters import Cluster
from . import commands as slurm

if TYPE_CHECKING:
    from ...job.spec import JobSpec
    from ..jobinfo import JobInfo
    from ..record import JobRecord


class SlurmBackend:
    name = "slurm"

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    def submit(self, spec: "JobSpec", template_dirs: Sequence[str] = (), check: bool = True,
               note: Callable[[str], None] = lambda line: None) -> "JobRecord":
        from .submit import submit

        with slurm.on(self.cluster):
            return submit(spec, self.cluster, template_dirs, check=check, note=note)

    def info(self, job_id: str) -> "JobInfo":
        with slurm.on(self.cluster):
            return slurm.info(job_id)

    def wait(self, job_id: str, on_change: Callable[["JobInfo"], None]) -> "JobInfo":
        with slurm.on(self.cluster):
            return slurm.wait(job_id, on_change=on_change)

    def cancel(self, job_id: str) -> None:
        with slurm.on(self.cluster):
            slurm.cancel(job_id)

    def readable(self, record: "JobRecord", reports_only: bool = False) -> "JobRecord":
        if not self.cluster.remote:
            return record
        from ..ssh import mirror

        return mirror.fetch_reports(record) if reports_only else mirror.fetch(record)

    def readable_file(self, path: str, job_id: str) -> Path:
        if not self.cluster.remote:
            return Path(path)
        from ..ssh import mirror

        return mirror.fetch_file(self.cluster, path, job_id)
