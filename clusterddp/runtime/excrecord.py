"""The record of an exception that ends a rank (contract.EXCEPTION_FILE: its type, message and where, the user's
own frame apart), written before Python prints it; a lost peer's survivor keeps its state first (peer heal)."""
from __future__ import annotations

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
