"""Step telemetry: where each step's time goes on this rank, for ``clusterddp top`` and ``report``.

A step ends at each ``should_stop()`` (or ``runtime.step()``) after an optimizer step: where the runtime sees the
optimizer (torch's), a boundary with no optimizer step since the last one is a micro-batch's (gradient
accumulation), folded into the step it belongs to. Within it the runtime times what it can see: waiting
for data (its loader's fetch, and whatever was not timed between the step's start and its first forward pass: any
iterable's fetch), the gradient all-reduce the rank waits for after its backward (a DDP communication hook that
wraps the default one, so the arithmetic is DDP's own), the optimizer step (torch's global optimizer hooks), the
stop agreement and checkpoint saves; compute is the rest. In DDP a slow rank shows up in the others' waiting: the
straggler waits least. Work per step: a few clock reads and one row in a bounded list; the control thread writes
the file (``contract.TELEMETRY_FILE``), never a collective. ``CLUSTERDDP_TELEMETRY=0`` turns it all off.
"""
from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections import deque
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Deque, Dict, Iterator, List, Mapping, Optional

from .. import contract
from ..datafiles import write_atomic
from . import gpu
from .state import STATE

KEEP = 128          # recent steps kept per rank (the file stays under ~10 KB; top reads 64 of them in < 50 ms)
WRITE_S = 2.0       # the control thread writes at most this often
_clock = time.perf_counter


def node(rank: int, local_world_size: int, environ: Mapping[str, str]) -> str:
    """This rank's node: Slurm's name for it (the local backend names its emulated nodes the same way), else the
    host name."""
    if environ.get("SLURMD_NODENAME"):
        return environ["SLURMD_NODENAME"]
    if environ.get(contract.LOCAL):
        return contract.LOCAL_NODE.format(index=rank // max(1, local_world_size))
    return socket.gethostname()


def enabled(environ: Mapping[str, str]) -> bool:  # on unless CLUSTERDDP_TELEMETRY is 0 / off / false / no
    return environ.get(contract.TELEMETRY, "1").strip().lower() not in ("0", "off", "false", "no")


class Steps:
    """This rank's step clock and its recent steps."""

    def __init__(self, rank: int, world_size: int, local_world_size: int, restart: int,
                 run_dir: Optional[Path] = None) -> None:
        self.run_dir = run_dir
        self.meta = {"rank": rank, "world_size": world_size, "local_world_size": local_world_size,
                     "restart": restart, "node": node(rank, local_world_size, os.environ), "pid": os.getpid(),
                     "init": time.time()}
        self.lock = threading.Lock()
        self.writing = threading.Lock()
        self.acc = dict.fromkeys(("data", "comm", "opt", "ckpt"), 0.0)
        self.sums = dict.fromkeys(("total",) + contract.TELEMETRY_PHASES, 0.0)
        self.recent: Deque[List[float]] = deque(maxlen=KEEP)
        self.start: Optional[float] = None   # when the step in progress began (None: no work seen yet)
        self.first: Optional[float] = None   # wall time the first step began
        self.open = False                    # work seen since the last boundary
        self.fed = False                     # the first forward pass since the last boundary was seen
        self.since = (0.0, 0.0)              # the last boundary (a folded one too): clock, time timed by then
        self.stepped = 0                     # optimizer steps since the last boundary
        self.folding = False                 # an optimizer step was seen: a boundary without one is a micro-batch's
        self.loose = 0                       # steps ended before the first optimizer step (merged at it)
        self.count = 0                       # steps ended in this attempt
        self.base = 0                        # steps done before it (the checkpoint it resumed from)
        self.based: Optional[bool] = None    # resumed from a checkpoint that knew its step count (None: no resume)
        self.pending: List[Any] = []         # CUDA event pairs of all-reduces not finished yet
        self.version = self.written = 0
        self.hooks: List[Any] = []
        self.fd = -1                         # the position file (-2: cannot be written)
        self.boarded = 0                     # the last step sent to TensorBoard

    def begin(self) -> None:
        """Work of a step was seen (a batch fetched, a forward pass, an optimizer step)."""
        if not self.open:
            self.open = True
            if self.start is None:
                self.start, self.first = _clock(), time.time()
            self._mark(self.base + self.count + 1, time.time())  # a step counts as run once it began

    def forward(self) -> None:
        """A forward pass. The step's first: what was not timed since the step began (its boundary) was spent getting
        its batch, whatever iterable gave it, so it counts as data (runtime.loader's own data time, a checkpoint
        save, are timed already: not twice). Gradient accumulation's and evaluation's later forwards: nothing."""
        if not self.fed:
            self.fed = True
            if self.start is not None:
                with self.lock:
                    at, timed = self.since if self.since[0] else (self.start, 0.0)
                    self.acc["data"] += max(0.0, _clock() - at - (sum(self.acc.values()) - timed))
        self.begin()

    def optimized(self) -> None:
        """An optimizer step ended. The first of the attempt: the boundaries before it were micro-batches of this
        step (gradient accumulation), so the steps they ended are merged back into it."""
        self.stepped += 1
        if not self.folding:
            self.folding = True
            with self.lock:
                merged = [self.recent.pop() for _ in range(min(self.loose, len(self.recent)))]
                for row in merged:
                    for name, value in zip(contract.TELEMETRY_ROW[2:], row[2:]):
                        self.sums[name] -= value
                    for name in self.acc:
                        self.acc[name] += row[contract.TELEMETRY_ROW.index(name)]
                if merged and self.start is not None:
                    self.start -= sum(row[2] for row in merged)
                self.count -= len(merged)
                self.loose = 0

    def add(self, phase: str, seconds: float) -> None:
        with self.lock:
            self.acc[phase] += seconds

    def position(self) -> int:
        """Steps done so far, counted across resumes, the step in progress included (what a checkpoint holds)."""
        return self.base + self.count + (1 if self.open else 0)

    def resumed(self, steps: Optional[int]) -> None:
        """A checkpoint was loaded: the steps before it are not this attempt's (None: a checkpoint without count)."""
        self.base, self.based = int(steps or 0), steps is not None

    def end(self) -> None:
        """A step boundary."""
        now = _clock()
        self._settle_cuda()
        self.fed = False
        if not self.open and self.count == 0:  # should_stop() before any work: the clock starts here
            self.start = now
            return
        if self.folding and not self.stepped and self.open:  # a micro-batch's boundary: the step goes on
            with self.lock:
                self.since = (now, sum(self.acc.values()))
            return
        self.loose += 0 if self.folding else 1
        self.stepped, self.since = 0, (0.0, 0.0)
        start = now if self.start is None else self.start
        total = max(0.0, now - start)
        with self.lock:
            acc, self.acc = self.acc, dict.fromkeys(self.acc, 0.0)
        compute = max(0.0, total - sum(acc.values()))
        row = [self.base + self.count + 1, round(time.time(), 3), total, acc["data"], compute, acc["comm"],
               acc["opt"], acc["ckpt"]]
        self.recent.append([row[0], row[1]] + [round(v, 6) for v in row[2:]])
        for name, value in zip(contract.TELEMETRY_ROW[2:], row[2:]):
            self.sums[name] += value
        self.count += 1
        self.start, self.open = now, False
        self.version += 1
        self._mark(self.base + self.count, row[1])

    def _mark(self, position: int, end: float) -> None:
        """The position file: steps done and when, rewritten in place at every step (one pwrite: still there when
        the process is killed a moment later, where the summary file is up to WRITE_S old)."""
        if self.run_dir is None or self.fd == -2:
            return
        try:
            if self.fd == -1:
                path = self.run_dir / contract.TELEMETRY_POS.format(restarts=self.meta["restart"],
                                                                     rank=self.meta["rank"])
                path.parent.mkdir(parents=True, exist_ok=True)
                self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
            os.pwrite(self.fd, f"{position:012d} {end:017.3f}\n".encode(), 0)
        except OSError:
            self.fd = -2  # a run directory that cannot be written: the summary file's writer says so

    def _settle_cuda(self) -> None:
        keep = []
        for begun, ended in self.pending:
            if ended.query():
                self.add("comm", begun.elapsed_time(ended) / 1000.0)
            else:
                keep.append((begun, ended))
        self.pending = keep

    def snapshot(self) -> Dict[str, Any]:
        return dict(self.meta, version=1, first=self.first, steps=self.count, base=self.base, based=self.based,
                    gpu=gpu.state(), written=time.time(), sums={k: round(v, 6) for k, v in self.sums.items()},
                    fields=list(contract.TELEMETRY_ROW), recent=list(self.recent))

    def flush(self) -> None:
        """Write the file if steps ended since the last write (the control thread; shutdown; exit: one at a time)."""
        with self.writing:
            if self.run_dir is not None and self.version != self.written:
                self._write(self.run_dir)

    def _write(self, run_dir: Path) -> None:
        version = self.version
        path = run_dir / contract.TELEMETRY_FILE.format(restarts=self.meta["restart"], rank=self.meta["rank"])
        write_atomic(path, json.dumps(self.snapshot(), separators=(",", ":")))
        self.written = version
        self._board()

    def _board(self) -> None:
        """The steps since the last write, to TensorBoard too (where it is installed): RUN_DIR/tensorboard/rank-N."""
        from .report import tensorboard

        board = tensorboard(f"rank-{self.meta['rank']}")
        if board is None:
            return
        for row in list(self.recent):
            if row[0] > self.boarded:
                for name, value in zip(contract.TELEMETRY_ROW[2:], row[2:]):
                    board.add_scalar(f"step/{name}_ms", value * 1000, int(row[0]))
                self.boarded = int(row[0])
        board.flush()


def current() -> Optional[Steps]:
    return STATE.get("telemetry")


def start(rank: int, world_size: int, local_world_size: int, restart: int, run_dir: Optional[Path],
          environ: Mapping[str, str]) -> None:
    """init(): the clock and torch's optimizer hooks (removed by stop())."""
    if not enabled(environ):
        return
    import atexit

    import torch.optim.optimizer as optim

    steps = STATE["telemetry"] = Steps(rank, world_size, local_world_size, restart, run_dir)
    atexit.register(_last_words, steps)  # a script that never calls shutdown(): its last steps still written
    began: List[float] = []

    def before(optimizer: Any, args: Any, kwargs: Any) -> None:
        steps.begin()
        began.append(_clock())

    def after(optimizer: Any, args: Any, kwargs: Any) -> None:
        if began:
            steps.add("opt", _clock() - began.pop())
        steps.optimized()

    steps.hooks = [optim.register_optimizer_step_pre_hook(before), optim.register_optimizer_step_post_hook(after)]


def stop() -> None:
    """shutdown(): the last steps written, the hooks removed."""
    steps = STATE.get("telemetry")
    if steps is None:
        return
    for hook in steps.hooks:
        hook.remove()
    _last_words(steps)
    from .report import close_boards

    close_boards()
    if steps.fd >= 0:
        os.close(steps.fd)
        steps.fd = -2


def _last_words(steps: Steps) -> None:
    try:
        steps.flush()
    except OSError:
        pass


def flush_now(last: List[float]) -> None:
    """The control thread, once a second: the file rewritten at most every WRITE_S (``last``: when it was)."""
    steps = current()
    now = _clock()
    if steps is not None and now - last[0] >= WRITE_S:
        last[0] = now
        steps.flush()


def began() -> None:
    """A forward pass (the DDP model's forward pre-hook): work of a step, and where its data arrived."""
    steps = current()
    if steps is not None:
        steps.forward()


def step() -> None:
    """End a step here (for loops that do not call ``should_stop()`` once per step)."""
    steps = current()
    if steps is not None:
        steps.begin()
        steps.end()


@contextmanager
def phase(name: str) -> Iterator[None]:
    """Time the block as ``name`` (data, comm, opt or ckpt) of the step in progress."""
    steps = current()
    if steps is None:
        yield
        return
    steps.begin()
    began = _clock()
    try:
        yield
    finally:
        steps.add(name, _clock() - began)


def took(name: str, began: float) -> None:
    """Count the time since ``began`` (``clock()``) as ``name`` of the step in progress (which it begins)."""
    steps = current()
    if steps is not None:
        steps.begin()
        steps.add(name, _clock() - began)


def clock() -> float:
    return _clock()
