"""The small error hierarchy. Every error a user can cause derives from ClusterDDPError."""
from __future__ import annotations

from typing import Sequence

from .contract import EXIT


class ClusterDDPError(Exception):
    """Base of every clusterddp error. ``exit_code`` is what the CLI exits with."""

    exit_code = EXIT["RUNTIME"]


class SpecError(ClusterDDPError, ValueError):
    """An invalid job specification (a usage error: exit code 2)."""

    exit_code = EXIT["USAGE"]


class TemplateError(ClusterDDPError):
    """A template could not be found or rendered."""

    exit_code = EXIT["USAGE"]


class SlurmError(ClusterDDPError):
    """A Slurm command failed; carries argv, exit code and stderr."""

    def __init__(self, message: str, argv: Sequence[str] = (), returncode: int | None = None,
                 stderr: str = "") -> None:
        self.argv = list(argv)
        self.returncode = returncode
        self.stderr = stderr
        detail = []
        if self.argv:
            detail.append("command: " + " ".join(self.argv))
        if returncode is not None:
            detail.append(f"exit code {returncode}")
        if stderr.strip():
            detail.append("stderr: " + stderr.strip())
        super().__init__(message + ("\n  " + "\n  ".join(detail) if detail else ""))


class JobNotFound(SlurmError):
    """A job id that Slurm does not know (any more)."""


class SlurmUnreachable(ClusterDDPError):
    """No Slurm to talk to from here: no commands, no configuration, or the controller does not answer. One line
    that names what was tried and the ways forward (never a job called unknown when Slurm was not asked)."""


class ClusterUnreachable(SlurmUnreachable):
    """A remote cluster could not be reached or used over SSH (ssh, rsync, the login node); one line saying what to
    do."""


class LocalRunError(ClusterDDPError):
    """The local backend could not run the job."""


class RuntimeEnvError(ClusterDDPError):
    """The in-job environment does not describe a consistent distributed job."""


class HostlistError(ClusterDDPError, ValueError):
    """A malformed host list; the message names the bad part."""

    exit_code = EXIT["USAGE"]


class PreflightError(SpecError):
    """The cluster cannot run this job as asked (a usage error: change the request)."""


class BackendUnsupported(SpecError):
    """What a cluster's backend cannot do (a usage error: choose another cluster or command)."""


class JobFailed(ClusterDDPError):
    """A rank of the job raised (the message holds its traceback) or the job did not complete."""


class LogNotFound(ClusterDDPError):
    """A job's log is not there (yet): the job may be pending, or was not submitted with clusterddp here."""


__all__ = ["ClusterDDPError", "SpecError", "TemplateError", "SlurmError", "JobNotFound", "SlurmUnreachable",
           "ClusterUnreachable", "LocalRunError",
           "RuntimeEnvError", "HostlistError", "PreflightError", "BackendUnsupported", "JobFailed", "LogNotFound"]
