"""What every backend says of a job (JobInfo): its state, why it waits, how it ended; which states are final and
which pending reasons Slurm never gets past."""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Optional

from ..rollcall import printable


class JobState(str, Enum):
    """The job states clusterddp reasons about, as Slurm spells them. ``JobInfo.state`` stays the text a backend
    said (Slurm may say a state that is not here); members compare equal to that text. MISSING is clusterddp's own:
    a sweep's trial that was submitted and never ran, or a local run whose run directory is gone."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    CONFIGURING = "CONFIGURING"
    COMPLETING = "COMPLETING"
    REQUEUED = "REQUEUED"
    REQUEUE_HOLD = "REQUEUE_HOLD"
    REQUEUE_FED = "REQUEUE_FED"
    RESIZING = "RESIZING"
    SUSPENDED = "SUSPENDED"
    SIGNALING = "SIGNALING"
    STAGE_OUT = "STAGE_OUT"
    STOPPED = "STOPPED"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    TIMEOUT = "TIMEOUT"
    NODE_FAIL = "NODE_FAIL"
    PREEMPTED = "PREEMPTED"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    BOOT_FAIL = "BOOT_FAIL"
    DEADLINE = "DEADLINE"
    SPECIAL_EXIT = "SPECIAL_EXIT"
    REVOKED = "REVOKED"
    MISSING = "MISSING"

    __str__ = str.__str__        # printed as Slurm's word, not JobState.X
    __format__ = str.__format__  # type: ignore[assignment]
    __hash__ = str.__hash__      # in a set or dict, the same key as Slurm's word


S = JobState
TERMINAL_STATES = frozenset({S.COMPLETED, S.FAILED, S.CANCELLED, S.TIMEOUT, S.NODE_FAIL, S.PREEMPTED, S.OUT_OF_MEMORY,
                             S.BOOT_FAIL, S.DEADLINE, S.SPECIAL_EXIT, S.REVOKED, S.MISSING})  # (MISSING: never changes)
#: States of a job that is still in the queue (waiting, running or on its way out).
QUEUED_STATES = (S.PENDING, S.RUNNING, S.CONFIGURING, S.COMPLETING, S.REQUEUED, S.RESIZING, S.SUSPENDED,
                 S.REQUEUE_HOLD, S.REQUEUE_FED, S.SIGNALING, S.STAGE_OUT, S.STOPPED)
#: Final states that a fault report explains (a program's failure or a node's).
FAULT_STATES = (S.FAILED, S.NODE_FAIL)
# Reasons for which Slurm keeps a job PENDING forever (until someone changes it or the cluster): --wait stops
# following there and says why. DependencyNeverSatisfied: unless kill_invalid_depend is set. BadConstraints: e.g. a
# self-requeue that excluded nodes (ExcNodeList) and left fewer than the job's node count in its partition.
NEVER_STARTS = {
    "DependencyNeverSatisfied": "a job it depends on failed, so it will never start",
    "BadConstraints": "Slurm can never place it as asked (its node count, excluded nodes or features do not fit its "
                      "partition), so it will never start unless the job or the partition is changed",
}


@dataclass
class JobInfo:
    job_id: str
    state: str
    reason: str = ""
    elapsed: str = ""
    nodes: str = ""
    node_list: str = ""
    exit_code: Optional[int] = None
    signal: Optional[int] = None
    stdout_path: str = ""

    def __post_init__(self) -> None:
        # What squeue/sacct/scontrol printed (on a login node that may not be ours) is data: printable, one line,
        # bounded; a log path only when it is an absolute file name (scontrol's StdOut=/ is none).
        for name in ("state", "reason", "elapsed", "nodes", "node_list", "stdout_path"):
            value = getattr(self, name)
            setattr(self, name, printable(str(value)).replace("\n", "?")[:4096])
        if not self.stdout_path.startswith("/") or self.stdout_path.endswith("/"):
            self.stdout_path = ""

    @property
    def done(self) -> bool:
        return self.state in TERMINAL_STATES

    @property
    def never_starts(self) -> Optional[str]:
        """Why Slurm will keep this pending job waiting forever (NEVER_STARTS), or None."""
        return NEVER_STARTS.get(self.reason) if self.state == JobState.PENDING else None

    @property
    def return_code(self) -> int:
        """The exit code a shell would report for the job: 128+signal when killed, 1 for a failure without one."""
        if self.signal:
            return 128 + self.signal
        if self.exit_code:
            return self.exit_code
        return 0 if self.state == JobState.COMPLETED else 1
