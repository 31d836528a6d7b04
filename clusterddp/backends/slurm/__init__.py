"""The Slurm backend: this machine's Slurm, or a cluster's over SSH. The host (``Here`` or ``Ssh``) is a field,
chosen once from the cluster; every Slurm command goes through ``Slurm(host)`` (commands.py)."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Sequence, Tuple

from ...job.clusters import Cluster
from .. import BackendBase, host_for

if TYPE_CHECKING:
    import subprocess  # (annotations only)

    from ...job.spec import JobSpec
    from ..hosts import Host
    from ..jobinfo import JobInfo
    from ..record import JobRecord
    from .commands import Slurm


class SlurmBackend(BackendBase):
    name = "slurm"
    host: "Host"

    def __init__(self, cluster: Optional[Cluster] = None) -> None:
        self.cluster = cluster or Cluster()
        self.host = host_for(self.cluster)
        self._slurm: Optional["Slurm"] = None

    @property
    def slurm(self) -> "Slurm":
        """Its Slurm commands (imported on first use: --dry-run never runs one)."""
        if self._slurm is None:
            from .commands import Slurm

            self._slurm = Slurm(self.host)
        return self._slurm

    def script(self, spec: "JobSpec", template_dirs: Sequence[str] = ()) -> str:
        """Exactly the batch script ``submit`` writes for ``spec`` (a remote cluster: with clusterddp's job modules
        and the outputs' absolute place under the project's copy there, asked of the login node)."""
        from .script import render

        return render(self.host.script_spec(spec), template_dirs=template_dirs)

    def not_applied(self, spec: "JobSpec") -> List[str]:
        return []  # Slurm applies every option of the spec

    def submit(self, spec: "JobSpec", template_dirs: Sequence[str] = (), check: bool = True,
               note: Callable[[str], None] = lambda line: None) -> "JobRecord":
        from .submit import submit

        return submit(spec, self.host, self.slurm, template_dirs, check=check, note=note)

    def info(self, job_id: str) -> "JobInfo":
        return self.slurm.info(job_id)

    def wait(self, job_id: str, on_change: Callable[["JobInfo"], None] = lambda info: None) -> "JobInfo":
        return self.slurm.wait(job_id, on_change=on_change)

    def queue(self, job_ids: Sequence[str]) -> Dict[str, Tuple[str, str]]:
        return self.slurm.array_tasks(job_ids)

    def max_array_size(self) -> Optional[int]:
        return self.slurm.max_array_size()

    def cancel(self, job_id: str) -> None:
        self.slurm.cancel(job_id)

    def run_on_nodes(self, job_id: str, nodes: int, argv: Sequence[str],
                     timeout: float = 60) -> subprocess.CompletedProcess:
        return self.slurm.run_in_job(job_id, nodes, argv, timeout=timeout)

    def run_module(self, python: str, module: str, args: Sequence[str],
                   timeout: float = 120) -> subprocess.CompletedProcess:
        """``python -m module args`` where the jobs' files are (the login node), with this clusterddp's modules."""
        return self.host.python_module(python, module, args, timeout=timeout)

    def readable(self, record: "JobRecord", reports_only: bool = False) -> "JobRecord":
        if not self.host.remote:
            return record
        from ..ssh import mirror

        return mirror.fetch_reports(record) if reports_only else mirror.fetch(record)

    def readable_file(self, path: str, job_id: str) -> Path:
        if not self.host.remote:
            return Path(path)
        from ..ssh import mirror

        return mirror.fetch_file(self.cluster, path, job_id)

    def readable_tree(self, path: str, name: str, files: Sequence[str]) -> Path:
        """The files named ``files`` in each directory under ``path``, readable here (a sweep's trial files)."""
        if not self.host.remote:
            return Path(path)
        from ..ssh import mirror

        return mirror.fetch_tree(self.cluster, path, name, files)
