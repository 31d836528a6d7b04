"""A cluster reached over SSH: the connection (connection.py), the copy of the project's code there (copy.py) and
its jobs' files read back here (mirror.py). The only place clusterddp runs ssh or rsync."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Callable, List, Optional, Sequence, Tuple

from ...job.clusters import Cluster
from ..hosts import Placement

if TYPE_CHECKING:
    from ...job.spec import JobSpec


class Ssh:
    """A cluster's login node: the directory you submit from is copied there, each submission's job runs its own
    snapshot of that copy, and the outputs go under the copy (ssh/copy.py, ssh/connection.py)."""

    remote = True
    files_here = False

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    def run(self, argv: Sequence[str], cwd: Optional[str] = None,
            timeout: float = 60) -> subprocess.CompletedProcess:
        from . import connection

        return connection.run(self.cluster, argv, cwd=cwd, timeout=timeout)

    def where(self) -> str:
        from . import connection

        return connection.where(self.cluster)

    def python_module(self, python: str, module: str, args: Sequence[str],
                      timeout: float = 120) -> subprocess.CompletedProcess:
        """``python -m module args`` on the login node, with this clusterddp's modules first on PYTHONPATH."""
        from . import connection

        return connection.python_module(self.cluster, python, module, args, timeout=timeout)

    def job_spec(self, spec: "JobSpec") -> "JobSpec":
        from . import connection as remote

        return remote.job_spec(spec, self.cluster)

    def check_copy(self, spec: "JobSpec") -> None:
        from . import copy as code_copy

        code_copy.check_copy(self.cluster, spec, Path.cwd())  # counted here, before any connection

    def script_spec(self, spec: "JobSpec") -> "JobSpec":
        """The spec as submit renders it there: its outputs under the project's copy, by absolute path (the
        copy's place asked of the login node; nothing is copied or made)."""
        import sys

        from ...errors import ClusterUnreachable
        from . import copy as code_copy

        spec = self.job_spec(spec)
        if spec.output_dir.startswith("/"):
            return spec
        try:
            code = code_copy.code_dir(self.cluster, Path.cwd())
        except ClusterUnreachable as exc:  # a dry run works offline too, and says what it could not know
            print(f"clusterddp: warning: {str(exc).splitlines()[0]}; the script below names the outputs relative to "
                  f"the project's copy there ({code_copy.remote_code_dir(self.cluster, Path.cwd())}), where submit "
                  "writes its absolute path", file=sys.stderr)
            return spec
        return spec.replace(output_dir=os.path.normpath(f"{code}/{spec.output_dir}"))

    def place(self, spec: "JobSpec", check: bool, note: Callable[[str], None]) -> Placement:
        from . import copy as code_copy

        code = code_copy.prepare(self.cluster, spec, Path.cwd(), check)
        note(f"copied {len(code.sent.files)} changed file(s), {code.sent.bytes_sent} bytes, to {self.cluster.name}:"
             f"{code.path} (ssh {self.cluster.destination})")
        note(f"this job runs its own snapshot of the code (a later submit does not change it): {code.snapshot}")
        out = spec.output_dir if spec.output_dir.startswith("/") else f"{code.path}/{spec.output_dir}"
        return Placement(code.snapshot, os.path.normpath(out))  # the outputs stay with the copy, not the snapshot

    def write(self, path: str, text: str) -> None:
        from . import connection as remote

        remote.write(self.cluster, path, text)

    def move_aside(self, paths: Sequence[str]) -> List[Tuple[str, str]]:
        from . import connection as remote

        return [(old, kept) for old, kept in remote.move_aside(self.cluster, paths)]

    def shown(self, path: str) -> str:
        return f"{self.cluster.name}:{path}"
