"""Warm starts (issue 55): a rank started from a process that has already imported torch.

A new attempt's ranks pay Python's, torch's and ``torch._dynamo``'s imports again (seconds of CPU each), which is
most of the job's own start and of a lost node's recovery. One *warm server* per node (``python -m
clusterddp.runtime.warm serve``, its own job step, started before the first attempt and outliving the attempts'
steps) imports them once and waits. A rank's task is then a small *client* (``python -m clusterddp.runtime.warmrun
SCRIPT ARGS``): it hands the server its arguments, environment, working directory and standard streams; the server
forks, and the child runs the script as ``python SCRIPT ARGS`` would (``__main__``, ``sys.argv``, ``sys.path[0]``),
with the client's environment. The client relays every signal it gets to the child and ends as the child ended
(its exit code, or the same signal); a client that is gone (SIGKILL) takes the child with it. Where no server
answers (not started yet, gone with its node, another user's), the client execs the script itself: a cold start,
never a failure.

Fork safety: the server starts no thread of its own (NumPy's BLAS pool is fork-safe), never touches a GPU and never
initialises a process group; it forks from its main thread, as a DataLoader forks its workers from a process that
imported torch. The socket lives in this user's private directory in node memory (runtime/peerpaths.py: 0700,
owner checked); both ends check the other's uid (SO_PEERCRED).
"""
from __future__ import annotations

import datetime
import json
import os
import selectors
import signal
import socket
import struct
import sys
from typing import Dict, List, Mapping, Optional, Sequence

from .. import contract
from .warmchild import AGENT_ARGV, become

#: What the server imports before it serves: what a DDP script's start pays for (DDP's constructor imports
#: torch._dynamo) and clusterddp's own job side.
PRELOAD = ("numpy", "torch", "torch.distributed", "torch.nn.parallel", "torch._dynamo", "torch.utils.data",
           "clusterddp.runtime", "clusterddp.runtime.group", "clusterddp.runtime.peerheal",
           "clusterddp.runtime.checkpoint", "clusterddp.runtime.telemetry")
_MAX_REQUEST = 1 << 20
STARTING = ".starting"  # beside the socket while its server imports: its pid
#: What the client passes on: every signal someone sends a task (not those that cannot be caught, the ones a
#: process raises on itself for its own faults, and the terminal's job control).
RELAYED = [s for s in signal.Signals if s.name not in (
    "SIGKILL", "SIGSTOP", "SIGCHLD", "SIGWINCH", "SIGCONT", "SIGTSTP", "SIGTTIN", "SIGTTOU", "SIGSEGV", "SIGBUS",
    "SIGILL", "SIGFPE", "SIGTRAP", "SIGSYS")]


def socket_path(environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """This node's server socket for the job named by $CLUSTERDDP_WARM (None: warm starts off, or no private
    directory to trust)."""
    from .peerpaths import node_name, root, run_key

    environ = os.environ if environ is None else environ
    key = environ.get(contract.WARM, "")
    top = root(environ) if key else None
    return None if top is None else os.path.join(top, f"warm-{run_key(key)}-{node_name(environ)}.sock")


def at(sock: socket.socket, path: str, act: str) -> None:
    """bind or connect ``sock`` at ``path``; one longer than a socket address holds (108 bytes: a deep
    CLUSTERDDP_PEER_DIR) through its directory's descriptor (/proc/self/fd/N/NAME, Linux)."""
    if len(os.fsencode(path)) < 100:
        getattr(sock, act)(path)
        return
    fd = os.open(os.path.dirname(path), os.O_PATH | os.O_DIRECTORY)
    try:
        getattr(sock, act)(f"/proc/self/fd/{fd}/{os.path.basename(path)}")
    finally:
        os.close(fd)


def send(conn: socket.socket, text: str) -> None:
    """A line to the other end, which may be gone."""
    try:
        conn.sendall(text.encode())
    except OSError:
        pass


def peer_uid(conn: socket.socket) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


# --- the server ---------------------------------------------------------------------------------------------------
def serve(path: str, preload: Sequence[str] = PRELOAD) -> int:
    """Import, then fork a child per request until this step is ended (SIGTERM, or the job's end)."""
    import importlib
    import time

    began = time.monotonic()
    starting = path + STARTING
    with open(starting, "w") as fh:  # (clients wait for a server that is still importing: warmrun.py)
        fh.write(str(os.getpid()))
    print(f"clusterddp: warm server {os.getpid()}: starting", flush=True)
    try:
        for name in preload:
            try:
                importlib.import_module(name)
            except Exception:  # (a module that fails here is the rank's own to import, and to fail on)
                pass
        if os.path.lexists(path):
            os.unlink(path)  # (this user's private directory: a server of this job that is gone left it)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        at(listener, path, "bind")
        listener.listen(64)
    finally:
        os.unlink(starting)
    server = os.getpid()
    print(f"clusterddp: warm server {server}: ready in {time.monotonic() - began:.1f} s ({len(sys.modules)} modules "
          "imported)", flush=True)
    try:
        return _loop(listener)
    finally:
        if os.getpid() == server:  # (a child leaves through here too, as SystemExit: the socket is the server's)
            listener.close()
            if os.path.exists(path):
                os.unlink(path)


def _loop(listener: socket.socket) -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ)
    children: Dict[int, socket.socket] = {}
    while True:
        if sel.select(timeout=0.05):
            try:
                conn, _ = listener.accept()
            except OSError:  # (out of descriptors: the client finds no answer and starts its rank itself)
                continue
            conn.settimeout(5)  # (a client that sends nothing holds no other up for long)
            request = _receive(conn)
            conn.settimeout(None)
            if request is None:
                conn.close()
                continue
            sys.stdout.flush()
            sys.stderr.flush()
            try:
                pid = os.fork()
            except OSError:  # (a process limit, memory): the client starts its rank itself
                pid = -1
            if pid == 0:
                sel.close()
                listener.close()
                for other in children.values():
                    other.close()
                become(conn, *request)  # never returns
            for fd in request[3]:  # (the client's streams are the child's alone: its end is their EOF)
                os.close(fd)
            if pid < 0:
                conn.close()
                continue
            send(conn, "ok\n")
            children[pid] = conn
            try:
                what = "torchrun agent" if request[0][:2] == AGENT_ARGV else "rank process"
                print(f"clusterddp: warm server: forked {what} {pid} ({_named(request[1])}) at "
                      f"{datetime.datetime.now().isoformat(timespec='milliseconds')}", flush=True)
            except OSError:
                pass
        _reap(children)


def _named(env: Dict[str, str]) -> str:
    """Which rank a request is, as its task's variables say (for the server's log)."""
    return " ".join(f"{k}={env[k]}" for k in ("RANK", "SLURM_PROCID", "SLURM_STEP_ID") if k in env)[:200] or "-"


def _reap(children: Dict[int, socket.socket]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is not None:
            code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
            send(conn, f"exit {code}\n")
            conn.close()


def _receive(conn: socket.socket) -> Optional[tuple]:
    """A client's request: (argv, env, cwd, its three standard streams, its CPUs), or None (not this user's,
    malformed)."""
    fds: List[int] = []
    try:
        if peer_uid(conn) != os.getuid():
            return None
        head, ancillary, _, _ = conn.recvmsg(4, socket.CMSG_SPACE(3 * struct.calcsize("i")))
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.extend(struct.unpack(f"{len(data) // 4}i", data[:len(data) // 4 * 4]))
        size = struct.unpack("!I", head)[0] if len(head) == 4 else _MAX_REQUEST + 1
        body = b""
        while len(fds) == 3 and len(body) < size <= _MAX_REQUEST:
            chunk = conn.recv(size - len(body))
            if not chunk:
                break
            body += chunk
        if len(fds) == 3 and len(body) == size:
            request = json.loads(body)
            return request["argv"], request["env"], request["cwd"], fds, request.get("cpus"), \
                bool(request.get("unbuffered"))
    except (OSError, ValueError, KeyError, TypeError, struct.error):
        pass
    for fd in fds:  # (malformed, cut short, too large: nothing runs, the client starts its rank itself)
        os.close(fd)
    return None


def main(argv: Sequence[str]) -> int:
    if len(argv) == 1 and argv[0] == "serve":
        path = socket_path()
        if path is None:
            print(f"clusterddp: warm server: ${contract.WARM} is not set or the private directory is not this "
                  "user's: not serving", file=sys.stderr)
            return 0
        return serve(path)
    print("usage: python -m clusterddp.runtime.warm serve (a rank's task: python -m clusterddp.runtime.warmrun "
          "SCRIPT [ARGS...])", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
