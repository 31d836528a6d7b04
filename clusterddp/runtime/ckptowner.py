"""Whose checkpoint it is: the run that wrote it (a job, or a sweep's trial), and the mark a run leaves in the
directory it checkpoints into, so that two runs writing one directory at once are told so."""
from __future__ import annotations

import atexit
import json
import os
import socket
import time
from typing import Any, List, Mapping, Optional

from .. import contract
from ..datafiles import read_json, write_atomic
from . import ckptfile, report, rundir


def owner(environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """Whose checkpoints this job resumes: a sweep trial's (its sweep and key, the same in every rerun of the trial),
    else the job's run id (the same across its requeues and retries); None outside a job."""
    environ = os.environ if environ is None else environ
    run_dir = environ.get(contract.RUN_DIR)
    if not run_dir:
        return None
    trial = read_json(rundir.at(os.path.join(run_dir, contract.TRIAL_FILE)), 1 << 16)
    if isinstance(trial, dict) and isinstance(trial.get("sweep"), str) and isinstance(trial.get("key"), str):
        return f"sweep-{trial['sweep'][:40]}-trial-{trial['key'][:16]}"
    return report.run_id(environ)


CLAIM = ".clusterddp-writer-"  # + a run's tag: that run writes checkpoints in this directory now
_CLAIM_FRESH_S = 600  # a claim of another machine's run is live while it was renewed this recently (at each save)


def _alive(record: Mapping[str, Any], age: float) -> bool:
    if record.get("host") != socket.gethostname():
        return age < _CLAIM_FRESH_S
    pid = record.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def claim(directory: str, run: Optional[str]) -> List[str]:
    """Rank 0, before the first step: this run's mark in the checkpoint directory (removed at exit, renewed at each
    save), and the runs whose live mark is there too: they write the same checkpoint names."""
    where = rundir.at(directory)
    os.makedirs(where, exist_ok=True)
    mine = os.path.join(where, CLAIM + ckptfile.tag(run))
    write_atomic(mine, json.dumps({"run": run, "host": socket.gethostname(), "pid": os.getpid()}), mode=0o600)

    def unclaim() -> None:
        record = read_json(mine, 4096)
        if isinstance(record, dict) and record.get("pid") == os.getpid() and record.get("host") == socket.gethostname():
            try:
                os.unlink(mine)
            except OSError:
                pass

    atexit.register(unclaim)
    others = []
    try:
        names = [n for n in os.listdir(where) if n.startswith(CLAIM) and n != os.path.basename(mine)]
    except OSError:
        return []
    for name in names[:64]:
        path = os.path.join(where, name)
        record = read_json(path, 4096)
        try:
            age = time.time() - os.lstat(path).st_mtime
        except OSError:
            continue
        if not isinstance(record, dict):
            continue
        if _alive(record, age):
            others.append(f"{record.get('run')} (pid {record.get('pid')} on {record.get('host')})"[:200])
        elif record.get("host") == socket.gethostname():
            try:
                os.unlink(path)  # a run of this machine that ended without removing it (killed)
            except OSError:
                pass
    return others


def renew(directory: str, run: Optional[str]) -> None:
    """At each save: this run's mark is fresh (another machine's run reads a mark renewed lately as live)."""
    try:
        os.utime(rundir.at(os.path.join(directory, CLAIM + ckptfile.tag(run))))
    except OSError:
        pass
