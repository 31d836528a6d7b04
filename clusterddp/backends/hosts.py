"""Where a job's files go and its script is written: this machine (``Here``) or a cluster's login node over SSH
(``Ssh``). "Remote" is one object, chosen once from the cluster (``host_for``), not a mode checked at each step;
the submission flow (submit.py) is the same for both."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, List, Optional, Protocol, Sequence, Tuple

from ..errors import SpecError
from ..job.clusters import Cluster
from ..job.quoting import shown

if TYPE_CHECKING:
    from ..job.spec import JobSpec


@dataclass(frozen=True)
class Placement:
    """Where a submission's job runs (``cwd``: None = here, as submitted) and its outputs go (absolute)."""

    cwd: Optional[str]
    output_dir: str


class Host(Protocol):
    cluster: Cluster

    def job_spec(self, spec: "JobSpec") -> "JobSpec": ...           # the spec as it runs there

    def check_copy(self, spec: "JobSpec") -> None: ...              # before any connection

    def place(self, spec: "JobSpec", check: bool, note: Callable[[str], None]) -> Placement: ...

    def write(self, path: str, text: str) -> None: ...

    def move_aside(self, paths: Sequence[str]) -> List[Tuple[str, str]]: ...

    def shown(self, path: str) -> str: ...                           # a path there, as the user reads it


class Here:
    """This machine: the job runs where you submit from; its outputs under --output-dir."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    def job_spec(self, spec: "JobSpec") -> "JobSpec":
        return spec

    def check_copy(self, spec: "JobSpec") -> None:
        return None

    def place(self, spec: "JobSpec", check: bool, note: Callable[[str], None]) -> Placement:
        try:
            Path(spec.output_dir).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SpecError(f"cannot write the job script into --output-dir {shown(spec.output_dir)}: "
                            f"{exc.strerror}; choose a writable directory") from None
        return Placement(None, str(Path(spec.output_dir).resolve()))

    def write(self, path: str, text: str) -> None:
        try:
            Path(path).write_text(text, encoding="utf-8")
        except OSError as exc:
            raise SpecError(f"cannot write the job script into --output-dir {shown(os.path.dirname(path))}: "
                            f"{exc.strerror}; choose a writable directory") from None

    def move_aside(self, paths: Sequence[str]) -> List[Tuple[str, str]]:
        """Rename an existing batch log and run directory to NAME.1, NAME.2, ... (first free)."""
        moved = []
        for name in paths:
            path = Path(name)
            if path.exists():
                n = 1
                while path.with_name(f"{path.name}.{n}").exists():
                    n += 1
                path.rename(path.with_name(f"{path.name}.{n}"))
                moved.append((str(path), str(path.with_name(f"{path.name}.{n}"))))
        return moved

    def shown(self, path: str) -> str:
        return path


class Ssh:
    """A cluster's login node: the directory you submit from is copied there, each submission's job runs its own
    snapshot of that copy, and the outputs go under the copy (code_copy.py, remote.py)."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    def job_spec(self, spec: "JobSpec") -> "JobSpec":
        from .ssh import connection as remote

        return remote.job_spec(spec, self.cluster)

    def check_copy(self, spec: "JobSpec") -> None:
        from .ssh import copy as code_copy

        code_copy.check_copy(self.cluster, spec, Path.cwd())  # counted here, before any connection

    def place(self, spec: "JobSpec", check: bool, note: Callable[[str], None]) -> Placement:
        from .ssh import copy as code_copy

        code = code_copy.prepare(self.cluster, spec, Path.cwd(), check)
        note(f"copied {len(code.sent.files)} changed file(s), {code.sent.bytes_sent} bytes, to {self.cluster.name}:"
             f"{code.path} (ssh {self.cluster.destination})")
        note(f"this job runs its own snapshot of the code (a later submit does not change it): {code.snapshot}")
        out = spec.output_dir if spec.output_dir.startswith("/") else f"{code.path}/{spec.output_dir}"
        return Placement(code.snapshot, os.path.normpath(out))  # the outputs stay with the copy, not the snapshot

    def write(self, path: str, text: str) -> None:
        from .ssh import connection as remote

        remote.write(self.cluster, path, text)

    def move_aside(self, paths: Sequence[str]) -> List[Tuple[str, str]]:
        from .ssh import connection as remote

        return [(old, kept) for old, kept in remote.move_aside(self.cluster, paths)]

    def shown(self, path: str) -> str:
        return f"{self.cluster.name}:{path}"


def host_for(cluster: Cluster) -> Host:
    return Ssh(cluster) if cluster.remote else Here(cluster)
