"""``runtime.report(step=..., **metrics)``: a trial's metrics in its run directory, for ``clusterddp sweep status``
and ``clusterddp report``; ``run_id()``: one identity per job for the trackers (W&B, MLflow), the same in every
attempt, requeue and retry.

Rank 0 writes, every other rank returns at once. One JSON object per line in RUN_DIR/metrics.jsonl, each line
written by a single append (O_APPEND, one write), so a reader never sees half a line from a finished write, and a
line cut short by a kill is skipped by the reader. Outside a clusterddp job (no run directory) it does nothing.
"""
from __future__ import annotations

import collections
import json
import math
import os
import re
import sys
import threading
import time
from typing import Any, Dict, List, Mapping, Optional, Tuple

from .. import contract
from ..datafiles import read_json
from ..errors import RuntimeEnvError
from . import rundir, state


def _number(name: str, value: Any) -> float:
    if hasattr(value, "item"):  # a tensor or a numpy scalar
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RuntimeEnvError(f"runtime.report: metric {name!r} is {type(value).__name__}, expected a number")
    return float(value)


def _is_main(environ: Mapping[str, str]) -> bool:
    if "env" in state.STATE:
        return state.is_main()
    return environ.get("RANK", "0") == "0"  # before init(): the launcher's variable


def report(step: Optional[int] = None, **metrics: Any) -> bool:
    """Record ``metrics`` (numbers: floats, ints, one-element tensors) at ``step``; True when written here."""
    environ = os.environ
    if not metrics:
        raise RuntimeEnvError("runtime.report: no metric given; e.g. runtime.report(step=epoch, loss=loss)")
    values = {name: _number(name, v) for name, v in metrics.items()}
    if step is not None and (isinstance(step, bool) or not isinstance(step, int)):
        raise RuntimeEnvError(f"runtime.report: step must be an integer, got {step!r}")
    run_dir = environ.get(contract.RUN_DIR)
    if not run_dir or not _is_main(environ):
        return False
    # NaN and infinities are kept as strings JSON can carry (a diverged trial is a result too).
    fields = {k: (v if math.isfinite(v) else str(v)) for k, v in values.items()}
    line = json.dumps({"step": step, "time": round(time.time(), 3), "metrics": fields}, sort_keys=True) + "\n"
    fd = os.open(os.path.join(rundir.at(run_dir), contract.METRICS_FILE), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
    scalars = [(name, value) for name, value in values.items() if math.isfinite(value)]
    control = state.STATE.get("control")
    if control is not None and control.thread.is_alive():
        # The control thread writes them (within a second): TensorBoard's writer (its import the first time, then
        # its event files) costs rank 0 time in the steps it reports, which the other ranks wait out in their
        # all-reduce (it made rank 0 look like a straggler).
        if not _PENDING and not _BOARDS:  # (the first: a script that never calls shutdown() still writes them)
            import atexit

            atexit.register(drain)
        _PENDING.append((step, scalars))
    else:
        _board_metrics(step, scalars)
    return True


_BOARDS: Dict[str, Any] = {}
_PENDING: "collections.deque[Tuple[Optional[int], List[Tuple[str, float]]]]" = collections.deque()
_DRAINING = threading.Lock()
_FAILED: List[BaseException] = []


def _board_metrics(step: Optional[int], scalars: List[Tuple[str, float]]) -> None:
    board = tensorboard("metrics")
    if board is not None:
        for name, value in scalars:
            board.add_scalar(name, value, step)
        board.flush()


def drain() -> None:
    """The metrics runtime.report() left for TensorBoard (the control thread; shutdown; exit), oldest first. One at a
    time (at exit the control thread of a script that never called shutdown() may still run); a write that fails
    is said once and dropped (the metrics file has them): the control thread's watchdog never waits on it."""
    with _DRAINING:
        while _PENDING:
            item = _PENDING.popleft()
            try:
                _board_metrics(*item)
            except Exception as exc:
                if not _FAILED:
                    _FAILED.append(exc)
                    print(f"clusterddp: runtime.report: TensorBoard's events not written ({type(exc).__name__}: "
                          f"{exc}); RUN_DIR/{contract.METRICS_FILE} has the metrics", file=sys.stderr, flush=True)


def tensorboard(name: str) -> Any:
    """A TensorBoard writer for RUN_DIR/tensorboard/NAME, one per name, kept until ``close_boards()`` (shutdown).
    CLUSTERDDP_TENSORBOARD=1: wherever tensorboard is installed; 0: never; unset: once the script itself uses
    TensorBoard (torch.utils.tensorboard imported; importing it costs each rank a second or more of CPU)."""
    if name in _BOARDS:
        return _BOARDS[name]
    import sys

    run_dir = os.environ.get(contract.RUN_DIR)
    mode = os.environ.get(contract.TENSORBOARD, "").strip().lower()
    if not run_dir or mode in ("0", "off", "false", "no") or (mode == "" and "torch.utils.tensorboard" not in
                                                              sys.modules):
        return None
    try:
        from torch.utils.tensorboard import SummaryWriter

        board = SummaryWriter(log_dir=os.path.join(rundir.at(run_dir), "tensorboard", name))
    except Exception:  # not installed (an optional extra): the files of our own are there all the same
        board = None
    _BOARDS[name] = board
    return board


def close_boards() -> None:
    drain()
    for board in _BOARDS.values():
        if board is not None:
            board.close()
    _BOARDS.clear()


def _identity(path: str) -> Optional[List[str]]:
    """The job's identity record in its run directory (contract.IDENTITY_FILE: cluster, job, token), when it is one:
    a regular file reached without a link, small, well formed; else None (not trusted, nor any part of it)."""
    record = read_json(rundir.at(os.path.join(path, contract.IDENTITY_FILE)), 4096)
    if not isinstance(record, dict):
        return None
    fields = [record.get(k) for k in ("cluster", "job", "token")]
    texts = [f for f in fields if isinstance(f, str) and len(f) <= 128]
    if len(texts) != 3 or not re.fullmatch(r"[0-9a-f]{32}", texts[2]):
        return None
    return texts


def run_id(environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """This job's identity for experiment trackers: the same in every attempt of the job (retries on other nodes,
    Slurm requeues: they share the run directory and its identity file), another for another job or sweep trial,
    even one with the same run directory path (another cluster, a job id given again). None outside a job.
    The run directory's name, then a hash: of the identity the job's start wrote (cluster, job id, a random token)
    and the path; of the path alone where there is none (a batch script of an older clusterddp)."""
    import hashlib

    environ = os.environ if environ is None else environ
    run_dir = environ.get(contract.RUN_DIR)
    if not run_dir:
        return None
    path = os.path.abspath(run_dir).rstrip("/")
    # Letters, digits, - and _ only, 53 characters at most: safe as a W&B run id, an MLflow tag, a file name.
    name = re.sub(r"[^A-Za-z0-9_-]", "-", os.path.basename(path))[:40]
    identity = _identity(path)
    key = path if identity is None else json.dumps(identity + [path])
    return f"{name}-{hashlib.sha256(key.encode('utf-8', 'surrogateescape')).hexdigest()[:12]}"


def export_run_id() -> None:
    """init(): the identity in the environment where trackers look for it (W&B: WANDB_RUN_ID with WANDB_RESUME=allow,
    so a requeued job continues its run), unless the script's environment chose its own."""
    found = run_id()
    if found is None:
        return
    os.environ[contract.RUN_ID] = found
    if "WANDB_RUN_ID" not in os.environ:
        os.environ["WANDB_RUN_ID"] = found
        os.environ.setdefault("WANDB_RESUME", "allow")
