"""A job's identity in its run directory (contract.IDENTITY_FILE): the cluster, the job id and a random token,
written when a new job starts and kept across its requeues and retries. ``runtime.run_id()`` hashes it, so the
trackers (W&B, MLflow) and the checkpoints tell this job from another with the same run directory path (on another
cluster, or a job id Slurm gave again after its counter was reset). Login side: the batch script's supervisor and
the local backend write it; the job side only reads it."""
from __future__ import annotations

import json
import os
import secrets
import socket
from pathlib import Path
from typing import Mapping, Optional, Tuple, Union

from .. import contract
from ..datafiles import write_atomic


def write(run_dir: Union[str, Path], cluster: str, job: str, restart: int) -> bool:
    """The identity of job ``job`` on ``cluster``. Restart 0 (a new job): a fresh one, replacing whatever an earlier
    job with this path left. A later restart keeps the file as it is, and writes none where there is none: the job
    then keeps the id it began with (an allocation of an older clusterddp had the path-only id). True if written."""
    if restart > 0:
        return False
    record = {"cluster": cluster[:128], "job": job[:64], "token": secrets.token_hex(16)}
    write_atomic(Path(run_dir) / contract.IDENTITY_FILE, json.dumps(record, sort_keys=True) + "\n")
    return True


def of_slurm(environ: Optional[Mapping[str, str]] = None) -> Tuple[str, str]:
    """(cluster, job) of the Slurm job this runs in: SLURM_CLUSTER_NAME, else the host's name; an array task as
    ARRAYJOB_TASK (what squeue shows), else SLURM_JOB_ID."""
    environ = os.environ if environ is None else environ
    cluster = environ.get("SLURM_CLUSTER_NAME") or socket.gethostname()
    array, task = environ.get("SLURM_ARRAY_JOB_ID", ""), environ.get("SLURM_ARRAY_TASK_ID", "")
    job = f"{array}_{task}" if array and task else environ.get("SLURM_JOB_ID", "")
    return cluster, job
