"""The resumable data loader: this rank's share of a dataset, a new shuffle every epoch without set_epoch calls,
and a position (epoch, batches done) that a Checkpointer saves so a resumed job continues at the exact batch.

Imports torch at module level: ``clusterddp.runtime`` loads this module on first use of ``loader``.
"""
from __future__ import annotations

import itertools
import json
import os
from pathlib import Path
from typing import Any, Dict, Iterator, Mapping, Optional, Tuple

import torch
from torch.utils.data import DataLoader, DistributedSampler

from .. import contract
from ..datafiles import write_atomic
from . import rundir, telemetry
from .control import heartbeat
from .group import rank, world_size
from .state import STATE

_END = object()


class ResumableSampler(DistributedSampler):
    """DistributedSampler that can drop the indices already done at the start of the next epoch."""

    skip = 0  # indices to drop at the start of the next epoch (resuming mid-epoch)
    cut: Optional[Tuple[int, int]] = None  # migrate --check: (first indices, where the last batch starts)

    def __iter__(self) -> Iterator[int]:  # type: ignore[override]
        skip, self.skip = self.skip, 0
        if self.cut is not None and not skip:
            # the epoch's first batches, then its last one (often short): what a script's last step meets
            head, last = self.cut
            order = list(super().__iter__())
            return iter(order[:head] + order[max(head, last):])
        return itertools.islice(super().__iter__(), skip, None)


class EpochLoader(DataLoader):
    """DataLoader whose every ``iter()`` starts the next epoch of its ResumableSampler."""

    next_epoch = 0
    epoch = -1
    batches_done = 0
    seed = 0
    own_generator = False
    _skip_batches = 0
    _active = False  # inside an epoch's iteration (a `break` out of the loop ends it)
    number = 0       # which loader of the process (for migrate --check's files)

    def set_epoch(self, epoch: int) -> None:
        """Start the next iteration at ``epoch``."""
        self.next_epoch = epoch

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        self.epoch, self.next_epoch = self.next_epoch, self.next_epoch + 1
        self.sampler.set_epoch(self.epoch)  # type: ignore[attr-defined]
        if self.own_generator:
            # Each iter() draws a worker base seed; from a generator of its own, seeded per epoch, that draw
            # neither moves the global RNG nor depends on where a resumed run started.
            self.generator.manual_seed(self.seed * 1_000_003 + self.epoch)
        self.sampler.skip = self._skip_batches * (self.batch_size or 1)  # type: ignore[attr-defined]
        self.batches_done, self._skip_batches = self._skip_batches, 0
        self._active = True
        limit = _checking(self)
        if limit is not None and 1 < limit < len(self):
            size = self.batch_size or 1
            self.sampler.cut = ((limit - 1) * size, (len(self) - 1) * size)  # type: ignore[attr-defined]
        try:
            batches = super().__iter__()
            while limit is None or self.batches_done < limit:
                keeper = STATE.get("peer")
                took = keeper is not None and keeper.loader is self and keeper.fetched()  # (peer heal: a step's start)
                began = telemetry.clock()
                batch = next(batches, _END)
                if batch is _END:  # (the loop's last look is no step's work)
                    if took:
                        keeper.began = False  # type: ignore[union-attr]
                    return
                telemetry.took("data", began)
                self.batches_done += 1  # counted when handed out: a checkpoint after the step includes it
                heartbeat("batch")
                yield batch
        finally:
            self._active = False

    def state_dict(self) -> Dict[str, int]:
        """Where to resume: mid-epoch while an epoch is being iterated, else at the next epoch."""
        if self._active and self.batches_done < len(self):
            return {"epoch": self.epoch, "batches_done": self.batches_done}
        return {"epoch": self.next_epoch, "batches_done": 0}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        """Resume at a position from ``state_dict()``."""
        self.next_epoch, self._skip_batches = int(state["epoch"]), int(state["batches_done"])


_MADE = [0]  # loaders made in this process (their order names their check files)


def _checking(made: EpochLoader) -> Optional[int]:
    """``clusterddp migrate --check``: the batches per epoch, and this rank's first epoch's indices recorded."""
    text = os.environ.get(contract.CHECK_STEPS, "")
    run_dir = os.environ.get(contract.RUN_DIR)
    if not text.isdigit() or not run_dir:
        return None
    limit = max(1, min(int(text), 10_000))
    if made.epoch == 0:
        indices = list(DistributedSampler.__iter__(made.sampler))[:limit * (made.batch_size or 1)]  # type: ignore
        path = Path(rundir.at(run_dir)) / contract.CHECK_FILE.format(rank=rank(), loader=made.number)
        write_atomic(path, json.dumps({"rank": rank(), "loader": made.number, "batch_size": made.batch_size,
                                      "indices": [int(i) for i in indices]}))
    elif made.epoch == 1:
        write_atomic(Path(rundir.at(run_dir)) / contract.CHECK_SECOND_EPOCH.format(rank=rank()), "")
    return limit


def loader(dataset: Any, batch_size: int, shuffle: bool = True, seed: int = 0, drop_last: bool = False,
           epoch: int = 0, **kwargs: Any) -> EpochLoader:
    """A DataLoader over this rank's share of ``dataset`` (DistributedSampler); each new iteration advances the
    sampler's epoch, so shuffling differs per epoch without calling set_epoch. ``batch_size`` is per rank.

    It remembers where it is (``state_dict()``: epoch and batches done), so a Checkpointer can resume mid-epoch
    at the exact batch. ``drop_last`` is the DataLoader's, as in a plain DataLoader: each rank's last incomplete
    batch is dropped (the sampler pads the ranks' shares to one length, so every rank has as many batches).
    ``epoch``: where its first iteration starts (a loader made anew each epoch, given the epoch's number).
    """
    own_generator = "generator" not in kwargs
    if own_generator:
        kwargs["generator"] = torch.Generator()
    sampler = ResumableSampler(dataset, num_replicas=world_size(), rank=rank(), shuffle=shuffle, seed=seed)
    if os.environ.get(contract.CHECK_STEPS, "").isdigit() and kwargs.get("num_workers") and \
            "persistent_workers" not in kwargs:
        # migrate --check cuts every epoch to a few batches: workers started anew for each would be most of its time
        kwargs["persistent_workers"] = True
    made = EpochLoader(dataset, batch_size=batch_size, sampler=sampler, drop_last=drop_last, **kwargs)
    made.seed, made.own_generator, made.next_epoch = seed, own_generator, int(epoch)
    made.number, _MADE[0] = _MADE[0], _MADE[0] + 1
    return made
