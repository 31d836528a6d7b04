"""The child half of a warm start (runtime/warm.py): a process the node's warm server forked for a client becomes
what the client asked for, as ``python [-u] SCRIPT ARGS`` or ``python -m MODULE ARGS`` would start it: the client's
streams, environment, directory, CPUs, fresh random states; it ends as the client relays, or with the client."""
from __future__ import annotations

import io
import os
import signal
import socket
import sys
from typing import Dict, Iterator, List, Optional

from .. import contract
from .excrecord import exit_code

#: A request for torchrun's agent (the template's ``warmrun -m clusterddp.runtime.agent ...``), whose workers are
#: clients; it waits for node 0's store, and ends without the teardown, itself (agent.py).
AGENT_ARGV = ["-m", "clusterddp.runtime.agent"]


def become(conn: socket.socket, argv: List[str], env: Dict[str, str], cwd: str, fds: List[int],
           cpus: Optional[List[int]], unbuffered: bool = False) -> None:
    """The rank (or a torchrun agent): the client's streams, environment, directory and CPUs (its task's binding),
    then its script as ``__main__``; ``unbuffered``: the client ran as ``python -u`` (torchrun's workers do), so the
    rank's does too."""
    import runpy
    import threading

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL if sig != signal.SIGINT else signal.default_int_handler)
    for target, fd in enumerate(fds):  # (descriptors 0-2 are the client's now; the streams are made below)
        os.dup2(fd, target)
        os.close(fd)
    # The streams as the task's python makes them (-u: unbuffered; else stdout block-buffered unless a terminal,
    # stderr line-buffered), not as the server's were: what a killed rank wrote is in its log as it would be.
    sys.stdout, sys.stderr = (io.TextIOWrapper(
        raw if unbuffered else io.BufferedWriter(raw), encoding=old.encoding, errors=old.errors,
        line_buffering=not unbuffered and (fd == 2 or raw.isatty()), write_through=unbuffered)
        for fd, old, raw in ((1, sys.stdout, io.FileIO(1, "w", closefd=False)),
                             (2, sys.stderr, io.FileIO(2, "w", closefd=False))))
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    if cpus:
        try:
            os.sched_setaffinity(0, cpus)
        except (OSError, ValueError):
            pass
    _fresh_random()
    torch = sys.modules.get("torch")
    if torch is not None and env.get("OMP_NUM_THREADS", "").isdigit():  # (torch read the server's at its start;
        torch.set_num_threads(max(1, min(int(env["OMP_NUM_THREADS"]), os.cpu_count() or 1)))  # as it caps it)
    threading.Thread(target=_watch, args=(conn,), name="clusterddp-warm", daemon=True).start()
    if argv[:2] == AGENT_ARGV:  # (its workers know it by its pid: warmrun; it waits for node 0's store after the
        os.environ[contract.WARM_AGENT] = str(os.getpid())  # watch: a client killed meanwhile takes it with it)
    code = 0
    try:
        if argv[:1] == ["-m"]:
            sys.argv = list(argv[1:])  # (run_module puts the module's file first, as python -m does)
            sys.path[0] = cwd
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            _run_script(argv)
    except SystemExit as exc:
        code = exit_code(exc.code)
    except BaseException as exc:  # as Python would: the hook prints it (the runtime's excepthook records it), exit 1
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename in (__file__, runpy.__file__, "<frozen runpy>"):
            tb = tb.tb_next  # (the traceback starts in the script, as under python SCRIPT)
        # (as the interpreter sets them for an uncaught exception: the runtime's end at a lost peer reads them)
        sys.last_type, sys.last_value, sys.last_traceback = type(exc), exc, tb
        sys.excepthook(type(exc), exc.with_traceback(tb), tb)
        code = 1
        if isinstance(exc, KeyboardInterrupt):  # (as the interpreter ends at Ctrl-C: by SIGINT itself)
            sys.stdout.flush()
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
    sys.exit(code)


def _run_script(argv: List[str]) -> None:
    """``python SCRIPT ARGS``: a fresh ``__main__`` with the script's absolute ``__file__``, ``sys.argv`` as given,
    the script's directory first on ``sys.path``."""
    import builtins
    import types

    path = os.path.abspath(argv[0])
    with open(path, "rb") as fh:  # (compile() reads the coding declaration, as the interpreter does)
        code = compile(fh.read(), path, "exec", dont_inherit=True)
    main = types.ModuleType("__main__")
    main.__dict__.update(__file__=path, __builtins__=builtins, __cached__=None, __loader__=None, __spec__=None)
    sys.modules["__main__"] = main
    sys.argv = list(argv)
    sys.path[0] = os.path.dirname(path)
    exec(code, main.__dict__)


def _fresh_random() -> None:
    """The random states a new interpreter would have: Python's, NumPy's and torch's global ones seeded anew from
    the system, as each seeds itself at import (a fork would share the server's: every rank of a node drawing the
    same "random" numbers). (torch's GPU generators are made in the rank itself, at its first use of the GPU.)"""
    import random

    random.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.default_generator.seed()


def _watch(conn: socket.socket) -> None:
    """The client's relayed signals, raised here; the client gone (killed): this process goes too. (A forked
    torchrun agent's workers, clients in sessions of their own that nothing else would end, go with the agent:
    warmrun.py.)"""
    for line in lines(conn):
        if line.startswith(b"sig ") and line[4:].isdigit():
            os.kill(os.getpid(), int(line[4:]))
    os.kill(os.getpid(), signal.SIGKILL)


def lines(conn: socket.socket) -> Iterator[bytes]:
    """The other end's lines until it is gone (the server's ``ok`` and ``exit N``; the client's ``sig N``)."""
    buffer = b""
    while True:
        try:
            chunk = conn.recv(4096)
        except InterruptedError:
            continue
        except OSError:
            return
        if not chunk:
            return
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            yield line
