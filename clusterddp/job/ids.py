"""The shapes of the names clusterddp is given: job ids (as Slurm writes them) and cluster names, in one place."""
from __future__ import annotations

import re

from ..errors import SpecError
from .quoting import shown

HERE = "here"    # the cluster name of this machine's own Slurm
LOCAL = "local"  # this machine without Slurm: the local backend (--local), and where local sweeps are filed
_JOBID = re.compile(r"[0-9]+(_[0-9]+)?")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_LOCAL_JOB = re.compile(r"[Ll]([1-9][0-9]{0,8})")  # a local run's id: L7 (its number in this user's records)


def is_job_number(text: str) -> bool:
    """A plain job id as sbatch prints it: Slurm's job ids are uint32."""
    return bool(re.fullmatch(r"[0-9]{1,10}", text)) and int(text) < 1 << 32


def is_job_id(text: str) -> bool:
    """A job id as Slurm writes it: ``1234`` or an array task's ``1234_5``."""
    # Slurm's job ids and array indexes are uint32: a longer number is not one (and would never come back).
    return bool(_JOBID.fullmatch(text)) and all(is_job_number(p) for p in text.split("_"))


def check_job_id(job_id: str) -> str:
    """A job id as Slurm writes it; anything else is a usage error (it never reaches a command line)."""
    job_id = str(job_id).strip()
    if not is_job_id(job_id):
        raise SpecError(f"invalid job id {shown(job_id)}: expected a number such as 1234 (or 1234_5 for an array "
                        "task)")
    return job_id


def is_local_job_id(text: str) -> bool:
    """A local run's id as ``submit --local`` prints it: ``L7`` (``l7`` too)."""
    return bool(_LOCAL_JOB.fullmatch(str(text).strip()))


def local_job_id(text: str) -> str:
    """A local run's id, as filed (``L7``); anything else is a usage error."""
    m = _LOCAL_JOB.fullmatch(str(text).strip())
    if not m:
        raise SpecError(f"invalid local job id {shown(str(text))}: expected L and a number, such as L7")
    return f"L{m.group(1)}"


def check_any_job_id(job_id: str) -> str:
    """A Slurm job id (``1234``, ``1234_5``) or a local run's (``L7``), as filed."""
    if is_local_job_id(job_id):
        return local_job_id(job_id)
    job_id = str(job_id).strip()
    if not is_job_id(job_id):
        raise SpecError(f"invalid job id {shown(job_id)}: expected a number such as 1234 (or 1234_5 for an array "
                        "task), or a local run's id such as L7")
    return job_id


def check_cluster_name(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise SpecError(f"invalid cluster name {shown(name)}: expected letters, digits, '_', '.' or '-' (at most 64, "
                        "starting with a letter or digit)")
    return name
