"""Inside the job: DDP in one line. Runs on compute nodes; imports torch lazily and never click, jinja2, submitit
or a login-side module (a test holds it so).

    from clusterddp import runtime
    env = runtime.init()                 # process group from torchrun / srun / spawn variables
    model = runtime.wrap(model)          # instead of nn.DataParallel(model)
    data = runtime.loader(dataset, batch_size=64)   # DistributedSampler; set_epoch done for you
    runtime.print0("loss", runtime.all_reduce_mean(loss))

One concern per module: ``env`` (the pure DistEnv), ``group`` (process group, device, collectives, wrap),
``data`` (the resumable loader), ``checkpoint``, ``stop`` (stop requests agreed by all ranks), ``report`` (a sweep
trial's metrics), ``telemetry`` (where each step's time goes), ``doctor`` (the in-job half of
``clusterddp doctor``).
"""
from __future__ import annotations

from typing import Any

from .checkpoint import Checkpointer
from .control import heartbeat
from .env import DistEnv
from .group import (
    DEFAULT_TIMEOUT_S,
    Joined,
    all_reduce_mean,
    barrier,
    device,
    init,
    is_main,
    log,
    print0,
    rank,
    save_on_main,
    select_device,
    shutdown,
    unwrap,
    world_size,
    wrap,
)
from .report import report, run_id
from .spawning import spawn
from .stop import should_stop
from .telemetry import step

_LAZY = {"loader", "EpochLoader", "ResumableSampler"}  # clusterddp.runtime.data imports torch at module level


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from . import data

        return getattr(data, name)
    raise AttributeError(f"module 'clusterddp.runtime' has no attribute {name!r}")


__all__ = ["DistEnv", "Joined", "init", "shutdown", "wrap", "unwrap", "loader", "is_main", "print0", "log",
           "barrier", "all_reduce_mean", "save_on_main", "device", "rank", "world_size", "select_device", "spawn",
           "should_stop", "step", "report", "run_id", "heartbeat", "Checkpointer", "DEFAULT_TIMEOUT_S"]
