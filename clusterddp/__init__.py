"""clusterddp: DistributedDataParallel on Slurm as easy as DataParallel.

Two sides (docs/layout.md): the login side (CLI, spec, templates, Slurm commands, the Python API) imports click
and jinja2, never torch; the job side, ``clusterddp.runtime``, imports torch lazily and never a login-side module.
``import clusterddp`` loads the errors only; ``JobSpec`` and the Python API load on first use.
"""
from __future__ import annotations

from .errors import ClusterDDPError, SlurmError, SpecError, TemplateError  # noqa: E402
from .version import __version__  # noqa: E402

__all__ = ["JobSpec", "ClusterDDPError", "SpecError", "SlurmError", "TemplateError", "__version__",
           "submit_function", "submit_script", "map_array", "job_attempts"]

_API = ("submit_function", "submit_script", "map_array", "job_attempts", "Job", "JobFailed")


def __getattr__(name: str) -> object:
    # The spec loads on first use (so that the job side, clusterddp.runtime, never loads it), and the Python API
    # (with submitit behind it) too, so the CLI never pays for it.
    if name == "JobSpec":
        from .job.spec import JobSpec

        return JobSpec
    if name in _API:
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module 'clusterddp' has no attribute {name!r}")
