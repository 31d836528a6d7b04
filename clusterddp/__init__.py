"""clusterddp: DistributedDataParallel on Slurm as easy as DataParallel.

Login-node side (CLI, spec, templates) imports click and jinja2 only; ``clusterddp.runtime`` (inside the job)
imports torch, lazily. ``import clusterddp`` stays cheap: it loads the spec and the errors, nothing more.
"""
from __future__ import annotations

__version__ = "0.1.0"

from .errors import ClusterDDPError, SlurmError, SpecError, TemplateError  # noqa: E402
from .spec import JobSpec  # noqa: E402

__all__ = ["JobSpec", "ClusterDDPError", "SpecError", "SlurmError", "TemplateError", "__version__",
           "submit_function", "submit_script", "map_array"]

_API = ("submit_function", "submit_script", "map_array", "Job", "JobFailed")


def __getattr__(name: str) -> object:
    # The Python API (and submitit behind it) loads on first use, so the CLI never pays for it.
    if name in _API:
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module 'clusterddp' has no attribute {name!r}")
