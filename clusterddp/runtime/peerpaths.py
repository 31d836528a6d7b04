"""Where peer heal keeps its states (issue 55): this user's private directory in node memory, one per run and node,
whether it is on at all, and the write of a survivor's state there."""
from __future__ import annotations

import hashlib
import os
import re
import stat
import sys
from typing import Any, Mapping, Optional, Set

from .. import contract


def enabled(environ: Optional[Mapping[str, str]] = None) -> bool:
    """On unless CLUSTERDDP_PEER_HEAL is 0 / off / false / no (``submit --no-peer-heal`` sets it)."""
    environ = os.environ if environ is None else environ
    return environ.get(contract.PEER_HEAL, "1").strip().lower() not in ("0", "off", "false", "no")


def node_name(environ: Optional[Mapping[str, str]] = None) -> str:
    """The node this rank runs on, as Slurm (or the local backend's emulation) names it: states are kept per node,
    and a rank reads only its own node's (several emulated or test-cluster nodes share one machine's /dev/shm)."""
    import socket

    environ = os.environ if environ is None else environ
    name = environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)[:64] or "node"


def root(environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """This user's private directory of states (made 0700 when missing), or None where it cannot be trusted."""
    environ = os.environ if environ is None else environ
    base = environ.get(contract.PEER_DIR) or "/dev/shm"
    path = os.path.join(base, f"clusterddp-{os.getuid()}")
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        return _untrusted(path, f"it cannot be made ({exc.strerror})")
    try:
        info = os.lstat(path)
    except OSError as exc:
        return _untrusted(path, f"it cannot be read ({exc.strerror})")
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        # planted by someone else, a link, or readable by others: never used
        what = "not a directory" if not stat.S_ISDIR(info.st_mode) else \
            f"owned by uid {info.st_uid}" if info.st_uid != os.getuid() else f"mode {stat.S_IMODE(info.st_mode):04o}"
        return _untrusted(path, f"it is not this user's private directory ({what}); remove it, or set "
                                f"{contract.PEER_DIR} to a directory of node memory of your own")
    return path


_SAID: Set[str] = set()


def _untrusted(path: str, why: str) -> Optional[str]:
    """Said once a process (the ranks' logs, a warm server's): peer heal and warm starts go on without it."""
    if path not in _SAID:
        _SAID.add(path)
        print(f"clusterddp: {path} is not used (peer heal keeps no state, warm starts start cold): {why}",
              file=sys.stderr, flush=True)
    return None


def run_key(run: str) -> str:
    return hashlib.sha256(run.encode()).hexdigest()[:20]


def node_dir(run: str, environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    top = root(environ)
    return None if top is None else os.path.join(top, run_key(run), node_name(environ))


def write(keeper: Any, why: Optional[str]) -> Optional[str]:
    """A survivor's state (``keeper.state()``), or where it cannot tell it (``why``) a file saying why, written
    in this node's directory of the run (peerheal.Keeper, at a lost peer); returns the state's path."""
    import torch

    from .state import rank

    state = keeper.state() if why is None else {"run": keeper.run, "uid": os.getuid(), "node": node_name(),
                                                "rank": rank(), "declined": why}
    where = node_dir(keeper.run)
    if state is None or where is None:
        return None
    os.makedirs(where, 0o700, exist_ok=True)
    path = os.path.join(where, f"rank-{rank()}.pt")
    temp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "wb") as fh:
            torch.save(state, fh)
        os.replace(temp, path)
    except BaseException:
        os.unlink(temp)  # (node memory: a /dev/shm full of a half-written state would hold it until a reboot)
        raise
    if why is not None:  # (written all the same: the next attempt says why it resumes from the checkpoint)
        print(f"clusterddp: peer heal: rank {rank()} kept no state: {why}", flush=True)
        return None
    print(f"clusterddp: peer heal: rank {rank()} kept the state of step {state['step']} in {path}", flush=True)
    return path
