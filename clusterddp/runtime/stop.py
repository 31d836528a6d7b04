"""Stopping early (time limits, preemption): signals and the stop file, agreed on by every rank at one call."""
from __future__ import annotations

import os
import signal
from typing import Any, Dict

from .. import contract
from . import drill, telemetry, writer
from .control import heartbeat
from .state import STATE, channel, distributed


def _stop() -> Dict[str, Any]:
    return STATE.setdefault("stop", {"signal": None, "polled": False, "previous": {}})


def install() -> None:
    """SIGUSR2 and SIGTERM ask the job to stop at the next should_stop(). A script that never calls should_stop()
    keeps the default meaning of those signals."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return
    state = _stop()
    for sig in (signal.SIGUSR2, signal.SIGTERM):
        previous = signal.getsignal(sig)
        state["previous"][sig] = previous

        def handler(signum: int, frame: Any, previous: Any = previous) -> None:
            if not _stop()["polled"]:
                signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
                os.kill(os.getpid(), signum)
                return
            _stop()["signal"] = signum

        signal.signal(sig, handler)


def uninstall() -> None:
    """Give the signals back their meaning from before init() (shutdown() leaves nothing behind)."""
    import threading

    previous = STATE.get("stop", {}).get("previous", {})
    if threading.current_thread() is threading.main_thread():
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
    STATE.pop("stop", None)


def should_stop() -> bool:
    """True on every rank at the same call once a stop was requested (the time-limit warning, SIGUSR2, SIGTERM,
    or the job's stop file): checkpoint and return. The ranks agree collectively, so none runs ahead. A background
    checkpoint (Checkpointer(background=True)) is waited for when the answer is True; one that failed raises here
    on every rank."""
    state = _stop()
    state["polled"] = True
    heartbeat("stop")
    keeper = STATE.get("peer")  # peer heal's: a step ended (before the collective below: a peer lost in it leaves
    if keeper is not None:  # this step's stateful extras kept)
        keeper.ended()
    stop_file = os.environ.get(contract.STOP_FILE)
    local = state["signal"] is not None or bool(stop_file and os.path.exists(stop_file))
    local = drill.step() or local
    write_failed = writer.failed()
    if distributed():
        import torch
        import torch.distributed as dist

        # On the CPU control channel (a gloo group beside the training group): with NCCL, a flag on the GPU
        # read back with .item() would synchronise the CUDA stream at every call. The second flag: rank 0's
        # background checkpoint write failed (every rank raises at this same call).
        flags = torch.tensor([1 if local else 0, 1 if write_failed else 0], dtype=torch.int32)
        with telemetry.phase("comm"):  # waiting here for the slowest rank is waiting too
            dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=channel())
        local, write_failed = bool(flags[0].item()), bool(flags[1].item())
    if write_failed or (local and "writer" in STATE):
        writer.settle()  # stopping: the checkpoint in flight is on disk before the script saves its last one
    steps = telemetry.current()
    if steps is not None:
        steps.end()
    return local
