"""The spawn launcher's ranks (torch.multiprocessing.spawn, one process a node starting the node's ranks)."""
from __future__ import annotations

import os
from typing import Any, Optional

from .. import contract
from .state import STATE


def spawn(fn: Any, nprocs: Optional[int] = None, args: tuple = ()) -> None:
    """torch.multiprocessing.spawn for the spawn launcher: sets LOCAL_RANK in each worker so that ``init()``
    finds its rank, then calls ``fn(local_rank, *args)``."""
    import signal
    import threading

    import torch.multiprocessing as mp

    n = nprocs or int(os.environ.get(contract.PROCS_PER_NODE, "1"))
    started: list = []
    # A stop request (SIGTERM, SIGUSR2: a time limit, the local runner ending an attempt) is the ranks' to answer:
    # passed on, and this process waits for them. By default it would die at once, and its ranks with it (SIGINT,
    # torch's parent-death signal) before a checkpoint at the limit or a lost peer's state is kept.
    def forward(signum: int, frame: Any) -> None:
        for proc in started[0].processes if started else []:
            if proc.is_alive() and proc.pid:
                os.kill(proc.pid, signum)  # (a rank that also got it from its process group: the same request)
    main = threading.current_thread() is threading.main_thread()
    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGUSR2)} if main else {}
    try:
        started.append(mp.start_processes(_spawned, args=(fn, args), nprocs=n, join=False, start_method="spawn"))
        while not started[0].join():
            pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _spawned(local_rank: int, fn: Any, args: tuple) -> None:
    os.environ["LOCAL_RANK"] = str(local_rank)
    try:
        fn(local_rank, *args)
    except Exception as exc:  # torch's wrapper prints it and exits: sys.excepthook never runs in a spawned rank, so
        record = STATE.get("record_exception")  # the runtime's record (and a lost peer's survivor's state) here
        if record is not None:
            record(type(exc), exc, exc.__traceback__)
        raise
