"""The Slurm backend: this machine's Slurm, or a cluster's over SSH (the host is chosen from the cluster)."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from .. import slurm
from ..clusters import Cluster

if TYPE_CHECKING:
    from ..jobinfo import JobInfo
    from ..record import JobRecord
    from ..spec import JobSpec


class SlurmBackend:
    name = "slurm"

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    def submit(self, spec: "JobSpec", template_dirs: Sequence[str] = (), check: bool = True,
               note: Callable[[str], None] = lambda line: None) -> "JobRecord":
        from ..submit import submit

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
        from .. import mirror

        return mirror.fetch_reports(record) if reports_only else mirror.fetch(record)

    def readable_file(self, path: str, job_id: str) -> Path:
        if not self.cluster.remote:
            return Path(path)
        from .. import mirror

        return mirror.fetch_file(self.cluster, path, job_id)
