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
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable, List, NoReturn

from .. import rollcall
from ..datafiles import write_atomic
from .peerlink import connection_lost
from .state import STATE

_ENDING: List[BaseException] = []  # the exception end_now was registered for
# File objects written in Python that a fast end closes (their trailers: what their deletion would write); any
# other is only flushed (3.12's gzip writes through a Python-level raw stream that must stay open until it closes).
_CLOSED_AT_END = (("gzip", "GzipFile"), ("bz2", "BZ2File"), ("lzma", "LZMAFile"))


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
        try:
            # (registered last, so run first of the exit handlers: it runs the others itself). Only for the exception
            # that ends the process: the main thread's, outside an interactive session.
            if connection_lost(exc) and threading.current_thread() is threading.main_thread() and \
                    not sys.flags.interactive:
                _ENDING[:] = [exc]
                atexit.register(end_now)
        except Exception:  # (a help: the exit is then the interpreter's own)
            pass
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
    runs, its open files are flushed (gzip, bz2 and lzma files closed whole, as their deletion would), then the
    process ends without the interpreter's teardown: 0.4-0.8 s with torch imported, paid by each survivor in turn
    where one waits on a peer that is tearing down, before srun or torchrun can start the next attempt. Skipped
    with it: other objects' __del__ (a ZipFile left open loses its directory) and C++ static destructors."""
    atexit.unregister(end_now)
    if getattr(sys, "last_value", None) is not (_ENDING[0] if _ENDING else None):
        return  # (the process goes on or ends otherwise: the interpreter's own exit)
    exit_without_teardown(1, _flush_open_files)  # (1: Python's own status for an uncaught exception)


def exit_code(value: object) -> int:
    """A SystemExit's code as the interpreter turns it into an exit status (a message printed: 1)."""
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    print(value, file=sys.stderr)
    return 1


def exit_without_teardown(code: int, flush_more: Callable[[], None] = lambda: None) -> NoReturn:
    """The interpreter's exit up to its teardown, then ``os._exit(code)``: every exit handler runs (logging's
    shutdown, multiprocessing's children, the script's own), the streams are flushed (and what ``flush_more``
    flushes), and what C code printed; the teardown itself (0.4-1.1 s with torch imported) is skipped. A rank at a
    lost peer (end_now) and a forked torchrun agent (warmchild) end this way."""
    try:
        atexit._run_exitfuncs()
    except BaseException:  # (Python 3.9 raises a handler's error again here; 3.10+ prints it)
        pass
    _flush(sys.stdout, sys.stderr)
    try:
        flush_more()
    except Exception:
        pass
    _flush(sys.stdout, sys.stderr)
    try:  # what C code printed (an extension's printf, torch's C++ logging) and the C library still holds
        import ctypes

        ctypes.CDLL(None).fflush(None)
    except Exception:
        pass
    os._exit(code)


def _flush_open_files() -> None:
    """Every open file object flushed, outer before inner: text into the files under it (a gzip file under
    gzip.open(..., "wt")), then the compressed files closed whole (their trailers), then the buffers."""
    standard = {id(s) for s in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)}
    files = [f for f in gc.get_objects() if issubclass(type(f), _io._IOBase) and id(f) not in standard]  # (type():
    # isinstance() would read __class__, which some objects turn into a deprecation warning)
    closing = tuple(getattr(sys.modules[m], n) for m, n in _CLOSED_AT_END if m in sys.modules)
    _flush(*(f for f in files if issubclass(type(f), _io.TextIOWrapper)))
    for f in files:
        if closing and issubclass(type(f), closing):
            try:
                f.close()
            except Exception:
                pass
    _flush(*(f for f in files if not issubclass(type(f), _io.TextIOWrapper)))


def _flush(*files: Any) -> None:
    for f in files:
        try:
            if f is not None and not f.closed and f.writable():
                f.flush()
        except Exception:  # (a file that cannot be flushed now would not have been at the teardown either)
            pass
