"""Whose checkpoint it is: the run that wrote it (a job, or a sweep's trial), and the mark a run leaves in the
directory it checkpoints into, so that two runs writing one directory at once are told so."""
from __future__ import annotations

import atexit
import json
import os
import socket
import time
from typing import Any, List, Mapping, NamedTuple, Optional

from .. import contract
from ..datafiles import read_json, write_atomic
from . import ckptfile, report, rundir


class Owner(NamedTuple):
    """Who writes and resumes checkpoints here: ``run`` (a sweep trial's sweep and key, the same in every rerun of
    the trial; else the job's run id, the same across its requeues and retries; None outside a job) and whether it
    is a sweep's trial, which clusterddp made distinct from its siblings."""

    run: Optional[str]
    trial: bool = False


def owner(environ: Optional[Mapping[str, str]] = None) -> Owner:
    environ = os.environ if environ is None else environ
    run_dir = environ.get(contract.RUN_DIR)
    if not run_dir:
        return Owner(None)
    trial = read_json(rundir.at(os.path.join(run_dir, contract.TRIAL_FILE)), 1 << 16)
    if isinstance(trial, dict) and isinstance(trial.get("sweep"), str) and isinstance(trial.get("key"), str):
        return Owner(f"sweep-{trial['sweep'][:40]}-trial-{trial['key'][:16]}", True)
    return Owner(report.run_id(environ))


def resumable(me: Owner, record: Optional[Mapping[str, Any]]) -> bool:
    """Whether ``me`` continues from a checkpoint with this manifest: a sweep's trial only from its own (never a
    sibling's, whose parameters differ); any other run from any other such run's (one directory is one line of
    work: "run the same command again" resumes, as documented), never from a trial's. A checkpoint of an older
    clusterddp (no run recorded) counts as such a run's."""
    written_by_trial = bool(record) and record.get("trial") is True  # type: ignore[union-attr]
    if me.trial or written_by_trial:
        return me.trial and written_by_trial and record.get("run") == me.run  # type: ignore[union-attr]
    return True


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
