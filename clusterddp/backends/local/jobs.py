"""A local run as a job: an id users can type (``L7``), filed with the jobs submitted from here, and its state read
from its run directory (the runner's own record, written when it starts and when it ends). ``status``, ``logs``,
``top``, ``report``, ``stacks`` and ``cancel`` then take the id as they take a Slurm job's.

The record of a run is data: the runner's process is signalled only when it is still the same process (its start
time, from /proc) on this host, and of this user (the record sits in this user's state directory)."""
from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any, Dict, Optional

from ... import contract
from ...datafiles import read_json, write_atomic
from ...errors import ClusterDDPError, JobNotFound
from ...job.ids import LOCAL, local_job_id
from ..jobinfo import JobInfo, JobState
from ..record import JobRecord, state_dir
from .run import start_time

_MAX_IDS = 1 << 20


def allocate() -> str:
    """A new local job id: the next free ``L<n>`` of this user, reserved by an exclusive create (two runs started
    at once get two ids)."""
    d = state_dir() / LOCAL
    d.mkdir(parents=True, exist_ok=True)
    taken = [int(p.name[1:-5]) for p in d.glob("L*.json") if p.name[1:-5].isdigit()]
    n = max(taken, default=0) + 1
    while n < _MAX_IDS:
        try:
            os.close(os.open(d / f"L{n}.json", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
            return f"L{n}"
        except FileExistsError:
            n += 1
    raise ClusterDDPError(f"no local job id left under {d}: remove old records there")


def started(job_id: str, run_dir: str, spec: Any) -> JobRecord:
    """The run has a directory: its record (what ``logs`` and ``top`` read) and the runner's own state. The record
    holds the directory's absolute path: the id is typed from any directory."""
    run_dir = os.path.abspath(run_dir)
    record = JobRecord(job_id, spec.script, str(Path(run_dir) / contract.LOCAL_LOG), run_dir, spec.launcher,
                       spec.tasks_per_node, spec.nodes, LOCAL, sys.executable)
    record.save()
    pid = os.getpid()
    write_atomic(Path(run_dir) / contract.LOCAL_JOB_FILE, json.dumps(
        {"job": job_id, "pid": pid, "started": start_time(pid), "host": socket.gethostname(), "began": time.time(),
         "nodes": spec.nodes}))
    return record


def ended(run_dir: str, code: int) -> None:
    """The run ended with ``code`` (its exit code): written beside its start."""
    path = Path(run_dir) / contract.LOCAL_JOB_FILE
    state = _state(Path(run_dir)) or {}
    state.update(code=int(code), ended=time.time())
    write_atomic(path, json.dumps(state))


def _state(run_dir: Path) -> Optional[Dict[str, Any]]:
    data = read_json(run_dir / contract.LOCAL_JOB_FILE, 1 << 14)
    return data if isinstance(data, dict) else None


def _number(data: Dict[str, Any], key: str) -> Optional[float]:
    value = data.get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _elapsed(seconds: float) -> str:
    s = max(0, int(seconds))
    return f"{s // 3600:d}:{s % 3600 // 60:02d}:{s % 60:02d}"


def record_of(job_id: str) -> JobRecord:
    job_id = local_job_id(job_id)
    record = JobRecord.load(job_id, LOCAL)
    if record is None:
        raise JobNotFound(f"no local run {job_id} here (clusterddp status lists the recent ones)")
    return record


def alive(state: Dict[str, Any]) -> bool:
    """The runner is still the process that wrote ``state``, on this host."""
    pid = state.get("pid")
    return state.get("host") == socket.gethostname() and isinstance(pid, int) and pid > 0 \
        and state.get("started") is not None and start_time(pid) == state.get("started")


def info(job_id: str) -> JobInfo:
    """The state of a local run: RUNNING while its runner lives, else how it ended (its exit code); a runner that
    is gone without writing its end (killed, the machine restarted) FAILED, saying so."""
    from ...healing.attempts import read

    record = record_of(job_id)
    run_dir = Path(record.run_dir)
    state = _state(run_dir) or {}
    found = read(run_dir)
    nodes = ",".join(found[-1].nodes) if found and found[-1].nodes else ",".join(
        contract.LOCAL_NODE.format(index=i) for i in range(record.nodes))
    began, end, code = _number(state, "began"), _number(state, "ended"), state.get("code")
    if isinstance(code, int) and end is not None:
        status = JobState.COMPLETED if code == 0 else JobState.CANCELLED \
            if code == contract.EXIT["INTERRUPTED"] else JobState.FAILED
        return JobInfo(record.job_id, status, "", _elapsed(end - (began or end)), str(record.nodes), nodes,
                       exit_code=code, stdout_path=record.batch_log)
    if state and alive(state):
        return JobInfo(record.job_id, JobState.RUNNING, "", _elapsed(time.time() - (began or time.time())),
                       str(record.nodes), nodes, stdout_path=record.batch_log)
    if not state and not run_dir.is_dir():  # (what it became cannot be told: not a failure)
        how = "" if run_dir.is_absolute() else (": a relative path, as an earlier clusterddp recorded it; ask from "
                                                "the directory the run started in")
        return JobInfo(record.job_id, JobState.MISSING, f"its run directory {run_dir} is not there (moved or removed"
                       f"{how})", "", str(record.nodes), nodes)
    elsewhere = state.get("host") not in (None, socket.gethostname())
    why = (f"runs or ran on host {state.get('host')}: ask there" if elsewhere else
           "its runner is gone without an end (killed, or the machine restarted)" if state else
           "it never started")
    return JobInfo(record.job_id, JobState.FAILED, why, "", str(record.nodes), nodes, exit_code=1,
                   stdout_path=record.batch_log)


def cancel(job_id: str) -> None:
    """End a running local run as Ctrl-C does (SIGTERM to its runner, which ends every rank and records it)."""
    record = record_of(job_id)
    state = _state(Path(record.run_dir)) or {}
    now = info(job_id)
    if now.state != JobState.RUNNING:
        raise ClusterDDPError(f"local run {record.job_id} is not running ({now.state}"
                              + (f": {now.reason}" if now.reason else "") + "): nothing to cancel")
    try:
        os.kill(int(state["pid"]), signal.SIGTERM)
    except ProcessLookupError:
        pass  # it ended in between
