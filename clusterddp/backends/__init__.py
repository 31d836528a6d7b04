"""Backends: where a job is sent and asked about, behind one small protocol and a registry (torchx's schedulers
are the model). A cluster names its backend (``backend = "slurm"`` in ``[clusters.NAME]``, the default); the
CLI and the library ask ``get(cluster)`` and never test which one they hold.

A new backend is one module with a class that has the protocol's methods, and one line in ``REGISTRY`` (or one
``register`` call, as the tests' own backend does). The registry names modules, never a value from a
configuration file: a profile chooses among the registered names only.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Callable, Dict, Protocol, Sequence

from ..errors import SpecError

if TYPE_CHECKING:
    from pathlib import Path

    from ..job.clusters import Cluster
    from ..job.spec import JobSpec
    from .jobinfo import JobInfo
    from .record import JobRecord


class Backend(Protocol):
    """What the CLI asks of a backend (bound to one cluster)."""

    cluster: "Cluster"

    def submit(self, spec: "JobSpec", template_dirs: Sequence[str], check: bool,
               note: Callable[[str], None]) -> "JobRecord": ...

    def info(self, job_id: str) -> "JobInfo": ...       # raises JobNotFound for an id it never had

    def wait(self, job_id: str, on_change: Callable[["JobInfo"], None]) -> "JobInfo": ...

    def cancel(self, job_id: str) -> None: ...

    def readable(self, record: "JobRecord", reports_only: bool = False) -> "JobRecord": ...  # its files, here

    def readable_file(self, path: str, job_id: str) -> "Path": ...


#: name -> "module:Class" (imported on first use, so an unused backend costs nothing).
REGISTRY: Dict[str, str] = {
    "slurm": "clusterddp.backends.slurm:SlurmBackend",
}


def register(name: str, target: str) -> None:
    """Add a backend: ``target`` is "module:Class" (the class takes the Cluster)."""
    REGISTRY[name] = target


def names() -> Sequence[str]:
    return sorted(REGISTRY)


def check_name(name: str, where: str) -> str:
    if name not in REGISTRY:
        from ..job.parse import suggest

        raise SpecError(f"{where}: unknown backend {name!r}{suggest(name, names())}; backends: {', '.join(names())}")
    return name


def get(cluster: "Cluster") -> Backend:
    """The backend of ``cluster``, bound to it."""
    module, _, cls = REGISTRY[check_name(cluster.backend, f"cluster {cluster.name}")].partition(":")
    return getattr(importlib.import_module(module), cls)(cluster)
