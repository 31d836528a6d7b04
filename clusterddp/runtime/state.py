"""The one home of runtime state: everything that survives between calls lives in ``STATE`` (set by
``group.init()``, cleared by ``group.shutdown()``), with the accessors every runtime module reads it through."""
from __future__ import annotations

from typing import Any, Dict

from ..errors import RuntimeEnvError
from .env import DistEnv

# env, device, backend, wrapped (DDP modules made by wrap(), released by shutdown), stop (see stop.py),
# control (the control thread, control.py), channel (the CPU gloo group for control traffic), writer (the background
# checkpoint write in flight, writer.py)
STATE: Dict[str, Any] = {}


def _env() -> DistEnv:
    if "env" not in STATE:
        raise RuntimeEnvError("clusterddp.runtime.init() has not been called in this process")
    return STATE["env"]


def device() -> Any:
    """This rank's torch.device (after init())."""
    _env()
    return STATE["device"]


def channel() -> Any:
    """The CPU (gloo) group beside the training group, for control traffic (after init())."""
    _env()
    return STATE["channel"]


def rank() -> int:
    """This process's global rank (0 before init())."""
    return STATE["env"].rank if "env" in STATE else 0


def world_size() -> int:
    """The number of ranks (1 before init())."""
    return STATE["env"].world_size if "env" in STATE else 1


def is_main() -> bool:
    """True on rank 0."""
    return rank() == 0


def distributed() -> bool:
    """A process group with more than one rank is up."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and world_size() > 1
