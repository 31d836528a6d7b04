"""Background checkpoint writes: rank 0 writes a copy taken in memory while training goes on; the next save,
``should_stop()``'s agreement, ``shutdown()`` and ``wait()`` wait for it, and a write that failed is an error on
every rank at that point (rank 0 alone knows, so its answer travels on the control channel)."""
from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import Any, Callable, Dict, Optional

from ..errors import RuntimeEnvError
from .collect import broadcast_json
from .state import STATE, distributed


def _writer() -> Dict[str, Any]:
    return STATE.setdefault("writer", {"thread": None, "path": None, "error": None})


def used() -> None:
    """This rank saves in the background (every rank says so, so that shutdown() settles on all of them)."""
    _writer()


def start(path: str, write: Callable[[], None]) -> None:
    """Run ``write`` on a thread of its own (rank 0; the previous write must be settled)."""
    state = _writer()

    def run() -> None:
        try:
            write()
        except BaseException as exc:  # reported on every rank at the next settle()
            state["error"] = f"{type(exc).__name__}: {exc}"

    # Not a daemon: a script that returns without shutdown() still gets its last checkpoint written at exit.
    thread = threading.Thread(target=run, name=f"clusterddp-checkpoint {path}", daemon=False)
    state.update(thread=thread, path=path, error=None)
    global _WATCHED
    if not _WATCHED:
        _WATCHED = True
        atexit.register(_at_exit)
    thread.start()


_WATCHED = False


def _at_exit() -> None:
    """A script that returned without shutdown(): its last write (joined by now: the thread is no daemon) must not
    fail unseen, so the process exits with 1 and says why."""
    state = STATE.get("writer") or {}
    if state.get("thread") is not None and state.get("error") is not None:
        sys.stdout.flush()
        print(f"clusterddp: the checkpoint {state['path']} could not be written by rank 0 ({state['error']}); the "
              "checkpoints before it are untouched; exiting with 1", file=sys.stderr, flush=True)
        os._exit(1)


def failed() -> bool:
    """The write in flight has already failed (rank 0, without waiting)."""
    state = STATE.get("writer", {})
    thread = state.get("thread")
    return thread is not None and not thread.is_alive() and state.get("error") is not None


def settle(peers_may_be_gone: bool = False) -> None:
    """Wait for the write in flight; raise on every rank if it failed (collective: call it on every rank).
    ``peers_may_be_gone`` (shutdown() on an error path): if the control channel is broken, what this rank knows
    is all there is."""
    state = STATE.get("writer")
    error: Optional[str] = None
    path = None
    if state is not None and state["thread"] is not None:
        state["thread"].join()
        error, path = state["error"], state["path"]
        state.update(thread=None, error=None)
    if distributed():
        try:
            error, path = broadcast_json([error, path])
        except Exception:
            if not peers_may_be_gone:
                raise
    if error is not None:
        raise RuntimeEnvError(f"the checkpoint {path} could not be written by rank 0 ({error}); the checkpoints "
                              "before it are untouched")
