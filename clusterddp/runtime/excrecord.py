"""The record of an exception that ends a rank (contract.EXCEPTION_FILE: its type, message and where, the user's
own frame apart), written before Python prints it; a lost peer's survivor keeps its state first (peer heal), and
ends without the interpreter's teardown once its exit handlers have run (end_now)."""
from __future__ import annotations

import _io
import atexit
import gc
import json
import os
import sys
import sysconfig
import time
import traceback
from pathlib import Path
from typing import Any, List

from .. import rollcall
from ..datafiles import write_atomic
from .peerlink import lost_peer
from .state import STATE


def library_prefixes() -> List[str]:
    """Where code the user did not write lives on this machine: the interpreter's, installed packages', ours."""
    paths = sysconfig.get_paths()
    found = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    found.add(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # clusterddp itself
    return sorted(found)


def install(path: Path, rank: int, restart: int) -> None:
    """This init's record (STATE["record_exception"]: the excepthook and spawning.py's ranks call it), and the
    excepthook that calls it, installed once a process (torch's init_process_group wraps it in its own)."""
    def record(kind: Any, exc: BaseException, tb: Any) -> None:
        if STATE.get("peer") is not None:  # issue 55 (runtime/peerheal.py): a lost peer's survivor keeps its state
            STATE["peer"].on_exception(exc)
        if lost_peer(exc):  # (registered last, so run first of the exit handlers: it runs the others itself)
            atexit.register(end_now)
        try:
            frames, prefixes = traceback.extract_tb(tb), library_prefixes()
            own = [f for f in frames if not rollcall.is_library(f.filename, prefixes)]
            at = [f"{f.filename}:{f.lineno}" for f in (frames[-1:] + own[-1:])]
            write_atomic(path, json.dumps({
                "rank": rank, "restart": restart, "time": time.time(),
                "type": f"{kind.__module__}.{kind.__qualname__}", "message": str(exc)[:500],
                "where": at[0] if at else "", "user": at[-1] if own else ""}))
        except Exception:  # the record is a help; the exception itself is still shown
            pass

    STATE["record_exception"] = record
    if getattr(sys.excepthook, "clusterddp", False):
        return
    previous = sys.excepthook

    def hook(kind: Any, exc: BaseException, tb: Any) -> None:
        STATE.get("record_exception", lambda *_: None)(kind, exc, tb)
        previous(kind, exc, tb)

    hook.clusterddp = True  # type: ignore[attr-defined]
    sys.excepthook = hook


def end_now() -> None:
    """A rank ended by a lost peer (its traceback printed, its non-daemon threads joined): every other exit handler
    runs, its open files are flushed (a Python-level file object, gzip's say, closed as its deletion would), then
    the process ends without the interpreter's teardown: 0.4-0.8 s with torch imported, paid by each survivor in
    turn where one waits on a peer that is tearing down, before srun or torchrun can start the next attempt."""
    atexit.unregister(end_now)
    atexit._run_exitfuncs()  # (logging's shutdown, multiprocessing's children, the script's own handlers)
    standard = {id(s) for s in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)}
    files = [f for f in gc.get_objects() if issubclass(type(f), _io._IOBase) and id(f) not in standard]  # (type():
    # isinstance() would read __class__, which some objects turn into a deprecation warning)
    # Outer before inner: text into the files under it (a gzip file under gzip.open(..., "wt")), then Python-level
    # file objects closed (gzip's trailer), then the buffers into the operating system.
    for kind in (_io.TextIOWrapper, None, _io._BufferedIOBase):
        for f in files:
            python_level = type(f).__module__ != "_io"
            if (python_level if kind is None else not python_level and issubclass(type(f), kind)):
                try:
                    if f.closed:
                        continue
                    if python_level:
                        f.close()
                    elif f.writable():
                        f.flush()
                except Exception:  # (a file that cannot be flushed now would not have been at the teardown either)
                    pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(1)  # Python's own status for an uncaught exception
