"""Where a rank meets the others: a port of its own (a single process), and the wait for rank 0's store."""
from __future__ import annotations

import random
import socket
import time


def free_port() -> int:
    """A free port on this machine (a single process's own group)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def await_store(addr: str, port: int, seconds: float) -> None:
    """Until rank 0's store listens (polled from every 20 ms to every 100 ms, with jitter: a thousand ranks do not
    knock at once; at most ``seconds``, the rendezvous timeout, which the control thread keeps): torch's client
    retries a refused connect after 0.25-0.75 s, then longer, so a rank that started before rank 0 joined 0.25-1.3 s
    after its store was up (measured here), at every job start and retry."""
    deadline, delay = time.monotonic() + seconds, 0.02
    while time.monotonic() < deadline:
        try:
            socket.create_connection((addr, port), timeout=1).close()
            return
        except (OSError, ValueError):  # (refused, not resolved yet, a name that cannot be one: torch then says)
            time.sleep(delay * random.uniform(0.5, 1.0))
            delay = min(delay * 1.5, 0.1)
