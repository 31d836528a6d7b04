"""The backends by name: name -> "module:Class", imported on first use (so an unused backend costs nothing).
A leaf: the cluster tables (job/clusters.py) check a backend's name here without importing any backend."""
from __future__ import annotations

from typing import Dict, Sequence

from ..errors import SpecError
from ..job.ids import LOCAL

#: name -> "module:Class".
REGISTRY: Dict[str, str] = {
    "slurm": "clusterddp.backends.slurm:SlurmBackend",
    LOCAL: "clusterddp.backends.local:LocalBackend",
}


def register(name: str, target: str) -> None:
    """Add a backend: ``target`` is "module:Class" (the class takes the Cluster)."""
    REGISTRY[name] = target


def names() -> Sequence[str]:
    """The backends a ``[clusters.NAME]`` table may name (``local`` is this machine: ``--local``, not a cluster)."""
    return sorted(n for n in REGISTRY if n != LOCAL)


def check_name(name: str, where: str) -> str:
    if name not in names():
        from ..job.parse import suggest

        raise SpecError(f"{where}: unknown backend {name!r}{suggest(name, names())}; backends: {', '.join(names())}")
    return name


