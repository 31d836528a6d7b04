"""Backends: where a job is sent and asked about, behind one small protocol and a registry (torchx's schedulers
are the model). A cluster names its backend (``backend = "slurm"`` in ``[clusters.NAME]``, the default); ``local``
is a backend too (this machine, no Slurm: ``--local`` is sugar for it). The CLI and the library ask ``get(...)``
and never test which one they hold.

A new backend is one module with a class that has the protocol's methods (``BackendBase`` answers "not supported
by this backend" for what it leaves out), and one line in ``REGISTRY`` (or one ``register`` call, as the tests' own
backend does). The registry names modules, never a value from a configuration file: a profile chooses among the
registered names only.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Protocol, Sequence, Tuple, Union

from ..errors import BackendUnsupported
from ..job.ids import LOCAL
from .registry import REGISTRY, check_name, names, register  # noqa: F401 (the registry's names, here too)

if TYPE_CHECKING:
    import subprocess  # (annotations only: the CLI's start-up never runs a command here)
    from pathlib import Path

    from ..job.clusters import Cluster
    from ..job.spec import JobSpec
    from .hosts import Host
    from .jobinfo import JobInfo
    from .record import JobRecord


class Backend(Protocol):
    """What the CLI and the library ask of a backend (bound to one cluster)."""

    name: str
    cluster: "Cluster"
    host: Optional["Host"]  # where its commands run and its jobs' files are (None: not on a host of ours)

    def unsupported(self, what: str) -> BackendUnsupported: ...     # the error for what it leaves out

    def script(self, spec: "JobSpec", template_dirs: Sequence[str] = ()) -> str: ...  # what --dry-run prints

    def not_applied(self, spec: "JobSpec") -> List[str]: ...        # the options it ignores, as flags

    def submit(self, spec: "JobSpec", template_dirs: Sequence[str] = (), check: bool = True,
               note: Callable[[str], None] = ...) -> "JobRecord": ...

    def run(self, spec: "JobSpec", quiet: bool = False, echo: Callable[[str], None] = ...,
            note: Callable[[str], None] = ..., prepare: Callable[[str], object] = ...,
            drill_env: Sequence[Tuple[str, str]] = (), run_dir: Optional[str] = None,
            job_id: Optional[str] = None) -> int: ...   # runs it here to its end: its exit code (the local backend)

    def info(self, job_id: str) -> "JobInfo": ...       # raises JobNotFound for an id it never had

    def wait(self, job_id: str, on_change: Callable[["JobInfo"], None] = ...) -> "JobInfo": ...

    def queue(self, job_ids: Sequence[str]) -> Dict[str, Tuple[str, str]]: ...  # array tasks: (state, elapsed)

    def max_array_size(self) -> Optional[int]: ...

    def cancel(self, job_id: str) -> None: ...

    def readable(self, record: "JobRecord", reports_only: bool = False) -> "JobRecord": ...  # its files, here

    def readable_file(self, path: str, job_id: str) -> "Path": ...

    def readable_tree(self, path: str, name: str, files: Sequence[str]) -> "Path": ...

    def run_on_nodes(self, job_id: str, nodes: int, argv: Sequence[str],
                     timeout: float = 60) -> subprocess.CompletedProcess: ...

    def run_module(self, python: str, module: str, args: Sequence[str],
                   timeout: float = 120) -> subprocess.CompletedProcess: ...  # where the jobs' files are


class BackendBase:
    """What a backend leaves out says so: one line naming the backend and the cluster, never an AttributeError."""

    name = "?"
    cluster: "Cluster"
    host: Optional["Host"] = None

    def unsupported(self, what: str) -> BackendUnsupported:
        return BackendUnsupported(f"{what} is not supported by the {self.name} backend (cluster "
                                  f"{self.cluster.name}): use a cluster whose backend is slurm")

    def script(self, spec: "JobSpec", template_dirs: Sequence[str] = ()) -> str:
        raise self.unsupported("printing the job's script (--dry-run)")

    def not_applied(self, spec: "JobSpec") -> List[str]:
        return []

    def run(self, spec: "JobSpec", quiet: bool = False, echo: Callable[[str], None] = print,
            note: Callable[[str], None] = print, prepare: Callable[[str], object] = lambda run_dir: None,
            drill_env: Sequence[Tuple[str, str]] = (), run_dir: Optional[str] = None,
            job_id: Optional[str] = None) -> int:
        raise self.unsupported("running a job here to its end (a queue runs it: submit)")

    def queue(self, job_ids: Sequence[str]) -> Dict[str, Tuple[str, str]]:
        raise self.unsupported("a sweep (one job array, its queue)")

    def max_array_size(self) -> Optional[int]:
        raise self.unsupported("a sweep (one job array)")

    def readable_tree(self, path: str, name: str, files: Sequence[str]) -> "Path":
        raise self.unsupported("reading a sweep's results")

    def run_on_nodes(self, job_id: str, nodes: int, argv: Sequence[str],
                     timeout: float = 60) -> subprocess.CompletedProcess:
        raise self.unsupported("running a command on a job's nodes")

    def run_module(self, python: str, module: str, args: Sequence[str],
                   timeout: float = 120) -> subprocess.CompletedProcess:
        raise self.unsupported("asking a job's ranks for their stacks (clusterddp stacks)")


def get(cluster: Union["Cluster", str]) -> Backend:
    """The backend of ``cluster`` (a Cluster, or ``LOCAL``: this machine without Slurm), bound to it."""
    if isinstance(cluster, str):
        if cluster != LOCAL:
            raise ValueError(f"backends.get: a Cluster or {LOCAL!r}, not {cluster!r}")
        module, _, cls = REGISTRY[LOCAL].partition(":")
        backend: Backend = getattr(importlib.import_module(module), cls)()
        return backend
    # (a local run's own cluster, from its id: the local backend; a [clusters.NAME] table names a registered one)
    name = LOCAL if cluster.backend == LOCAL and cluster.name == LOCAL else \
        check_name(cluster.backend, f"cluster {cluster.name}")
    module, _, cls = REGISTRY[name].partition(":")
    backend = getattr(importlib.import_module(module), cls)(cluster)
    return backend


def host_for(cluster: "Cluster") -> "Host":
    """The host of ``cluster``: its login node over SSH when it has a host, else this machine."""
    if cluster.remote:
        from .ssh import Ssh

        return Ssh(cluster)
    from .hosts import Here

    return Here(cluster)
