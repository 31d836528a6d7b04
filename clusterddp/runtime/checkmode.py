"""``clusterddp migrate --check`` on the job side, at shutdown: a digest of each wrapped model's parameters, so that
the check can tell whether the ranks stayed in step, and how many optimizer steps each rank took, whatever the
script names its optimizers (the loaders' part is in data.py)."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Iterable

import torch

from .. import contract
from ..datafiles import write_atomic
from . import rundir

_STEPS = {"taken": 0, "counting": False}


def _checking() -> bool:
    return os.environ.get(contract.CHECK_STEPS, "").isdigit() and bool(os.environ.get(contract.RUN_DIR))


def count_steps() -> None:
    """In a check: every optimizer's step counted (torch's global post-step hook), once per process."""
    if not _checking() or _STEPS["counting"]:
        return
    from torch.optim.optimizer import register_optimizer_step_post_hook

    def counted(*_: Any) -> None:
        _STEPS["taken"] += 1

    register_optimizer_step_post_hook(counted)
    _STEPS["counting"] = True


def check_models(wrapped: Iterable[Any], rank: int) -> None:
    """Parameters only, not buffers: BatchNorm's running statistics follow each rank's last batch."""
    run_dir = os.environ.get(contract.RUN_DIR)
    if not _checking() or not run_dir:
        return
    digests = []
    for model in wrapped:
        h = hashlib.sha256()
        for name, p in getattr(model, "module", model).named_parameters():
            h.update(name.encode())
            h.update(p.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
        digests.append(h.hexdigest())
    path = Path(rundir.at(run_dir)) / contract.CHECK_MODELS.format(rank=rank)
    write_atomic(path, json.dumps({"rank": rank, "models": sorted(digests), "optimizer_steps": _STEPS["taken"]}))
