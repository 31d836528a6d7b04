"""Where peer heal keeps its states (issue 55): this user's private directory in node memory, one per run and node,
and whether it is on at all."""
from __future__ import annotations

import hashlib
import os
import re
import stat
from typing import Mapping, Optional

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
    except OSError:
        return None
    try:
        info = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        return None  # planted by someone else, a link, or readable by others: never used
    return path


def run_key(run: str) -> str:
    return hashlib.sha256(run.encode()).hexdigest()[:20]


def node_dir(run: str, environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    top = root(environ)
    return None if top is None else os.path.join(top, run_key(run), node_name(environ))
