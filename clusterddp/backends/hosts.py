"""Where commands run, a job's files go and its script is written: this machine (``Here``) or a cluster's login
node over SSH (``Ssh``, backends/ssh/). "Remote" is one object, chosen once from the cluster (``host_for``) and held
by the backend as a field, not a mode checked at each step; the submission flow (slurm/submit.py) is the same for
both."""
from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Dict, List, NamedTuple, Optional, Protocol, Sequence, Tuple

from ..contract import without_parent_job
from ..errors import SpecError
from ..job.clusters import Cluster
from ..job.quoting import shown

if TYPE_CHECKING:
    import subprocess  # (imported where a command runs: --dry-run runs none)

    from ..job.spec import JobSpec


class Placement(NamedTuple):
    """Where a submission's job runs (``cwd``: None = here, as submitted) and its outputs go (absolute)."""

    cwd: Optional[str]
    output_dir: str


def clean_env() -> Dict[str, str]:
    """This environment without the variables of a Slurm job we may be running inside (contract.py says which)."""
    return without_parent_job(os.environ)


class Host(Protocol):
    cluster: Cluster
    remote: bool
    files_here: bool  # its jobs' files can be read here as they are written (else: copied here, or asked there)

    def run(self, argv: Sequence[str], cwd: Optional[str] = None,
            timeout: float = 60) -> subprocess.CompletedProcess: ...  # text output captured

    def where(self) -> str: ...                                      # for messages: "cluster hpc (ssh ...)"

    def python_module(self, python: str, module: str, args: Sequence[str],
                      timeout: float = 120) -> subprocess.CompletedProcess: ...  # with this clusterddp's modules

    def job_spec(self, spec: "JobSpec") -> "JobSpec": ...           # the spec as it runs there

    def script_spec(self, spec: "JobSpec") -> "JobSpec": ...        # ... and as submit renders it (--dry-run)

    def check_copy(self, spec: "JobSpec") -> None: ...              # before any connection

    def place(self, spec: "JobSpec", check: bool, note: Callable[[str], None]) -> Placement: ...

    def write(self, path: str, text: str) -> None: ...

    def move_aside(self, paths: Sequence[str]) -> List[Tuple[str, str]]: ...

    def shown(self, path: str) -> str: ...                           # a path there, as the user reads it


class Here:
    """This machine: the job runs where you submit from; its outputs under --output-dir."""

    remote = False
    files_here = True

    def __init__(self, cluster: Optional[Cluster] = None) -> None:
        self.cluster = cluster or Cluster()

    def run(self, argv: Sequence[str], cwd: Optional[str] = None,
            timeout: float = 60) -> subprocess.CompletedProcess:
        """``argv`` here, without a surrounding job's Slurm variables (FileNotFoundError: no such command)."""
        import subprocess

        return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, env=clean_env(), cwd=cwd)

    def where(self) -> str:
        return "this machine"

    def python_module(self, python: str, module: str, args: Sequence[str],
                      timeout: float = 120) -> subprocess.CompletedProcess:
        import sys

        return self.run([sys.executable, "-m", module, *args], timeout=timeout)

    def job_spec(self, spec: "JobSpec") -> "JobSpec":
        return spec

    def script_spec(self, spec: "JobSpec") -> "JobSpec":
        return spec  # the job runs here, from where it is submitted: its paths as given

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
        """Rename an existing batch log and run directory to NAME.1, NAME.2, ... (first free). A link there too,
        dangling or not (someone's plant: slurmstepd would write the batch log through it)."""
        moved = []
        for name in paths:
            path = Path(name)
            if os.path.lexists(path):
                n = 1
                while os.path.lexists(path.with_name(f"{path.name}.{n}")):
                    n += 1
                path.rename(path.with_name(f"{path.name}.{n}"))
                moved.append((str(path), str(path.with_name(f"{path.name}.{n}"))))
        return moved

    def shown(self, path: str) -> str:
        return path
