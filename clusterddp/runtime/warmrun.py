"""The client half of warm starts (runtime/warm.py): a rank's task. It hands its node's warm server the rank's
arguments, environment, working directory and standard streams, passes on every signal it gets, and ends as the
rank ended; where no server answers, it starts the rank itself (a cold start). A server still importing (its
marker beside the socket names a live process) is waited for, at most WAIT_S."""
from __future__ import annotations

import json
import os
import signal
import socket
import struct
import sys
import time
from typing import NoReturn, Optional, Sequence

from .. import contract
from .warm import RELAYED, STARTING, at, peer_uid, send, socket_path
from .warmchild import lines

WAIT_S = 120.0


def run(argv: Sequence[str]) -> int:
    """A rank's task: its script started by this node's server, else by itself (exec: a cold start)."""
    if os.environ.pop(contract.WARM_AGENT, None) == str(os.getppid()):
        _die_with_parent()
    path = socket_path()
    if path is None:
        _cold(argv, "")
    conn = _connect(path) if _ready(path) else None
    if conn is None:
        _cold(argv, f"no server answers at {path}")
    request = json.dumps({"argv": list(argv), "env": dict(os.environ), "cwd": os.getcwd(),
                          "cpus": sorted(os.sched_getaffinity(0)), "unbuffered": _unbuffered()}).encode()
    answers = lines(conn)
    try:
        message = struct.pack("!I", len(request)) + request  # (the streams go with its first bytes: warm._receive)
        sent = conn.sendmsg([message], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("3i", 0, 1, 2))])
        conn.sendall(message[sent:])
        started = next(answers, None) == b"ok"
    except OSError:
        started = False
    if not started:  # the server did not start it (refused, could not fork, gone): nothing ran, start it here
        conn.close()
        _cold(argv, "the server did not start it")
    for sig in RELAYED:  # every signal srun (or a user) sends the task reaches the rank
        try:
            signal.signal(sig, lambda num, _frame: send(conn, f"sig {num}\n"))
        except (OSError, ValueError):
            pass
    status = next((int(line[5:]) for line in answers if line.startswith(b"exit ")), None)
    if status is None:  # the server went away without the child's end (its node's step ended): as a lost rank
        return 1
    if status < 0:  # ended by a signal: the task too, by the same one (srun's "Killed", "Segmentation fault")
        if -status not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
        return 128 - status  # (a signal whose default is to go on)
    return status


def _die_with_parent() -> None:
    """A worker of a forked torchrun agent ends with the agent, however the agent ends (a cold agent's workers end
    with its srun step; a forked agent lives in its server's step, which outlives the attempt)."""
    import ctypes

    parent = os.getppid()
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG (Linux)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # (it ended before the call)
        os.kill(os.getpid(), signal.SIGKILL)


def _unbuffered() -> bool:
    """This interpreter runs as ``python -u`` (or PYTHONUNBUFFERED): its text streams write through, on a raw file
    (sys.flags does not say it)."""
    return bool(getattr(sys.stdout, "write_through", False)) and not hasattr(getattr(sys.stdout, "buffer", None),
                                                                             "raw")


def _cold(argv: Sequence[str], why: str) -> NoReturn:
    """The rank started here, as ``python [-u] SCRIPT ARGS`` (this process becomes it; -u where it ran so, as
    torchrun starts its workers); ``why``: what the log says (nothing where warm starts are off)."""
    if why:
        print(f"clusterddp: warm start: {why}; starting {' '.join(argv[:2])[:200]} cold", file=sys.stderr, flush=True)
    os.execv(sys.executable, [sys.executable, *(["-u"] if _unbuffered() else []), *argv])


def _ready(path: str) -> bool:
    """Whether the socket is there, once a server still importing (its live pid beside it) is waited for."""
    deadline = time.monotonic() + WAIT_S
    while not os.path.exists(path) and time.monotonic() < deadline:
        try:
            with open(path + STARTING) as fh:
                os.kill(int(fh.read(32)), 0)
        except (OSError, ValueError):
            return os.path.exists(path)  # no server starting (none, or it ended): whatever is there now
        time.sleep(0.05)
    return os.path.exists(path)


def _connect(path: str) -> Optional[socket.socket]:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        at(conn, path, "connect")
        if peer_uid(conn) != os.getuid():
            raise OSError("the server is another user's")
    except OSError:
        conn.close()
        return None
    return conn


if __name__ == "__main__":
    if len(sys.argv) < 2:
        print("usage: python -m clusterddp.runtime.warmrun SCRIPT [ARGS...] | -m MODULE [ARGS...]", file=sys.stderr)
        sys.exit(2)
    sys.exit(run(sys.argv[1:]))
