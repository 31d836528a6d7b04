"""The control plane inside the job: who has started, stack dumps on request, heartbeats and the hang watchdog.

One daemon thread per rank. It never touches the GPU and never calls a collective: it reads and writes small files
in the run directory (shared by every node, as logs and checkpoints are) and, once the process group is up, adds
this rank's progress to one counter in the group's TCP store, which every rank already talks to. Work in the
training loop is one integer increment per heartbeat.
"""
from __future__ import annotations

import json
import os
import re
import socket
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Set

from .. import contract, rollcall
from ..datafiles import write_atomic
from ..errors import RuntimeEnvError
from ..hostlist import HostlistError, expand
from ..rollcall import read_dumps, read_hellos, write_dump
from . import excrecord, rundir, telemetry
from .env import DistEnv
from .excrecord import library_prefixes
from .report import drain as drain_reports  # (the name: the package's `report` is the function)
from .state import STATE

POLL_S = 1.0          # how often a rank looks for a stack request
BEAT_S = 2.0          # how often a rank adds its progress to the store's counter
COLLECT_S = 15.0      # after a hang: how long the ranks wait for each other's dumps
_STORE_KEY = "clusterddp/progress"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")

#: Progress: [all beats, loader batches, forward passes, should_stop() calls, heartbeat() calls]; this rank's first
#: step is done at the second of any (a loop may call should_stop() before its step's work).
_BEATS = [0, 0, 0, 0, 0]
STEP_SOURCES = {"batch": (1, 2), "forward": (2, 2), "stop": (3, 2), "user": (4, 2)}


def heartbeat(source: str = "user") -> None:
    """Tell the hang watchdog that this rank advanced. The runtime's loader, ``should_stop()``, collectives and
    wrapped models do it already; call it in loops that use none of them. (``source``: the runtime's own.)"""
    _BEATS[0] += 1
    if source in STEP_SOURCES:
        _BEATS[STEP_SOURCES[source][0]] += 1


def first_step_done() -> bool:
    """Until then (imports, NCCL's lazy set-up, a compile; all_reduce_mean and barrier too) the limit is doubled."""
    return any(_BEATS[slot] >= need for slot, need in STEP_SOURCES.values())


def hang_timeout(environ: Mapping[str, str]) -> float:
    """Seconds from $CLUSTERDDP_HANG_TIMEOUT (default 900; 0 turns the watchdog off)."""
    text = environ.get(contract.HANG_TIMEOUT, "") or str(contract.DEFAULT_HANG_TIMEOUT_S)
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < 1e9:
        raise RuntimeEnvError(f"{contract.HANG_TIMEOUT}={text!r}: expected seconds (0 turns the hang watchdog off)")
    return value


def dump_stacks(rank: int, source: str = "runtime") -> Dict[str, Any]:
    """Every thread's Python stack in this process except the control thread's (no GPU work, no collective)."""
    prefixes = library_prefixes()
    names = {t.ident: t.name for t in threading.enumerate()}
    main = threading.main_thread().ident
    threads = []
    for ident, frame in sys._current_frames().items():
        if ident == threading.get_ident():
            continue
        frames = [{"file": fs.filename, "line": fs.lineno or 0, "func": fs.name, "text": (fs.line or "").strip(),
                   "lib": rollcall.is_library(fs.filename, prefixes)} for fs in traceback.extract_stack(frame)]
        threads.append({"name": names.get(ident, f"thread {ident}"), "main": ident == main, "frames": frames})
    threads.sort(key=lambda t: not t["main"])
    return {"rank": rank, "node": socket.gethostname(), "pid": os.getpid(), "time": time.time(), "source": source,
            "beats": _BEATS[0], "threads": threads}


def node_of(rank: int, env: DistEnv, hellos: Mapping[int, Mapping[str, Any]], environ: Mapping[str, str]) -> str:
    """The node a rank runs (or would run) on: every launcher places ranks in blocks in the step's node-list order
    (torchrun's node rank is SLURM_NODEID, given at its static rendezvous)."""
    if rank in hellos:
        return str(hellos[rank].get("node", "?"))
    node_index = rank // max(1, env.local_world_size)
    same_node = [h for r, h in hellos.items() if r // max(1, env.local_world_size) == node_index]
    if same_node:
        return str(same_node[0].get("node", "?"))
    # (the step's nodes: a retry on a spare runs on a part of the job's, in the job's order)
    nodelist = environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST", "")
    if nodelist and not environ.get(contract.LOCAL):
        try:
            hosts = expand(nodelist)
            if node_index < len(hosts):
                return hosts[node_index]
        except HostlistError:
            pass
    return f"node {node_index}"


def rendezvous_report(env: DistEnv, run_dir: Optional[Path], waited: float, environ: Mapping[str, str]) -> str:
    """Who did not arrive at the rendezvous, by rank and node (from the ranks' hello files)."""
    where = f"{env.master_addr}:{env.master_port}"
    if run_dir is None:
        return (f"the rendezvous at {where} did not complete in {waited:.0f} s (no {contract.RUN_DIR}: cannot tell "
                "which ranks arrived)")
    hellos = read_hellos(run_dir, _restarts(environ))
    missing = [r for r in range(env.world_size) if r not in hellos]
    if not missing:
        return (f"the rendezvous at {where} did not complete in {waited:.0f} s although all {env.world_size} ranks "
                f"started: a node cannot reach {where}? (clusterddp doctor checks the network)")
    named = "; ".join(f"rank {r} ({node_of(r, env, hellos, environ)}): never started" for r in missing[:16])
    more = f" and {len(missing) - 16} more" if len(missing) > 16 else ""
    return (f"the rendezvous at {where} did not complete in {waited:.0f} s: {len(hellos)} of {env.world_size} "
            f"ranks arrived; missing {named}{more}")


def _restarts(environ: Mapping[str, str]) -> int:
    text = environ.get(contract.RESTARTS, "0")
    return int(text) if text.isdigit() and len(text) < 10 else 0  # the batch script checked it; data all the same


class Control:
    """The control thread of one rank (init() starts it, shutdown() stops it)."""

    def __init__(self, env: DistEnv, run_dir: Optional[str], rendezvous_timeout: float,
                 environ: Mapping[str, str]) -> None:
        self.env, self.environ = env, dict(environ)
        self.run_dir = Path(run_dir) if run_dir else None
        self.restart = _restarts(self.environ)
        self.rendezvous_timeout, self.hang_timeout = rendezvous_timeout, hang_timeout(self.environ)
        # Unguessable where the job made a secret (contract.WATCH_KEY); the fixed name only for scripts run by hand.
        secret = self.environ.get(contract.WATCH_KEY, "")
        self.key = f"{_STORE_KEY}/{secret}" if re.fullmatch(r"[0-9a-f]{32}", secret) else _STORE_KEY
        self.store: Any = None
        self.answered: Set[int] = set()  # the ranks that answered a hang's roll call
        self.stopping, self.started = threading.Event(), time.monotonic()
        self.thread = threading.Thread(target=self._run, name="clusterddp-control", daemon=True)

    # --- called from the main thread ---------------------------------------------------------------------
    def start(self) -> None:
        self._hello("rendezvous")
        self._record_exceptions()
        self.thread.start()

    def joined(self, store: Any) -> None:
        self._hello("joined")
        self.store = store

    def stop(self) -> None:
        self.stopping.set()
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join(timeout=POLL_S + BEAT_S + 5)
        self._hello("left")

    def _record_exceptions(self) -> None:
        """An exception that ends this rank leaves a record beside its hello (then Python prints it as always)."""
        if self.run_dir is not None:
            excrecord.install(self.run_dir / contract.EXCEPTION_FILE.format(rank=self.env.rank), self.env.rank,
                              self.restart)

    # --- the thread --------------------------------------------------------------------------------------
    def _hello(self, state: str) -> None:
        if self.run_dir is None:
            return
        hello = {"rank": self.env.rank, "node": socket.gethostname(), "pid": os.getpid(), "state": state,
                 "restart": self.restart, "world_size": self.env.world_size,
                 "local_world_size": self.env.local_world_size, "launcher": self.env.source, "time": time.time()}
        try:
            write_atomic(self.run_dir / contract.HELLO_FILE.format(rank=self.env.rank), json.dumps(hello))
        except OSError as exc:
            print(f"clusterddp: cannot write to the run directory {rundir.shown(self.run_dir)} ({exc.strerror}): "
                  "clusterddp stacks will not find this rank", file=sys.stderr, flush=True)

    def _run(self) -> None:
        last_beat = 0.0
        sent, total, progressed = 0, -1, False
        last_progress: Optional[float] = None  # the clock starts at the first beat, whatever the store says then
        complained = False
        written = [0.0]
        while not self.stopping.wait(POLL_S):
            try:
                self._answer_request()
                telemetry.flush_now(written)
                drain_reports()
                now = time.monotonic()
                if self.store is None:
                    if now - self.started > self.rendezvous_timeout:
                        self._rendezvous_failed(now - self.started)
                    continue
                if self.hang_timeout <= 0 or now - last_beat < BEAT_S:
                    continue
                last_beat = now
                if last_progress is None:
                    last_progress = now
                beats = _BEATS[0]
                try:
                    seen = int(self.store.add(self.key, beats - sent))
                    sent = beats
                except Exception as exc:  # a store that fails (or holds a non-number) is no progress: the deadline
                    seen = total          # still applies, so a broken counter never switches the watchdog off
                    if not complained:
                        complained = True
                        print(f"clusterddp: control thread: progress counter: {type(exc).__name__}: {exc} "
                              "(counted as no progress)", file=sys.stderr, flush=True)
                if seen != total:  # the first reading only starts the clock
                    progressed = progressed or (total >= 0 and first_step_done())
                    total, last_progress = seen, now
                limit = self.hang_timeout * (1 if progressed else contract.HANG_STARTUP_FACTOR)
                # (a store gone because the other ranks finished first is no hang of a rank that is shutting down)
                if now - last_progress >= limit and not self.stopping.is_set():
                    self._hung(now - last_progress, limit)
            except Exception as exc:  # the control plane must never take the training down
                if self.stopping.is_set():
                    return
                if not complained:
                    complained = True
                    print(f"clusterddp: control thread: {type(exc).__name__}: {exc} (hang watchdog paused)",
                          file=sys.stderr, flush=True)
                time.sleep(BEAT_S)

    def _answer_request(self) -> None:
        if self.run_dir is None:
            return
        try:
            name = (self.run_dir / contract.REQUEST_FILE).read_text().strip()
        except OSError:
            return
        if not _NAME.fullmatch(name):
            return
        directory = self.run_dir / contract.DUMP_DIR.format(name=name)
        if directory.is_dir() and not (directory / f"rank-{self.env.rank}.json").exists():
            write_dump(directory, dump_stacks(self.env.rank))

    def _rendezvous_failed(self, waited: float) -> None:
        report = rendezvous_report(self.env, self.run_dir, waited, self.environ)
        print(f"clusterddp: rank {self.env.rank}: {report}", file=sys.stderr, flush=True)
        if self.run_dir is not None:
            path = self.run_dir / contract.RENDEZVOUS_REPORT.format(restarts=self.restart)
            hellos = read_hellos(self.run_dir, self.restart)
            if self.env.rank == min(hellos, default=self.env.rank):
                write_atomic(path, report + "\n")
            else:  # the first rank to exit ends the others (srun, torchrun): the report must be written by then
                deadline = time.monotonic() + COLLECT_S
                while time.monotonic() < deadline and not path.exists():
                    time.sleep(0.2)
        os._exit(contract.RENDEZVOUS_EXIT)

    def _hung(self, idle: float, limit: float) -> None:
        since = time.strftime("%H:%M:%S", time.localtime(time.time() - idle))
        rank = self.env.rank
        first = "" if limit == self.hang_timeout else ", doubled until the first step"
        print(f"clusterddp: rank {rank}: hang watchdog: no rank advanced since {since} ({idle:.0f} s, limit "
              f"{limit:.0f} s{first}); dumping stacks and ending the job (exit {contract.HANG_EXIT})",
              file=sys.stderr, flush=True)
        try:
            self._roll_call(idle, since)
        except Exception as exc:  # an unwritable run directory must not keep a hung job alive
            print(f"clusterddp: rank {rank}: no roll call ({type(exc).__name__}: {exc})", file=sys.stderr, flush=True)
        finally:
            keeper = STATE.get("peer")  # issue 55: a lost node's survivor keeps its state (its main thread waits)
            if keeper is not None:
                keeper.on_hang()
                self.wait_all_kept()
            os._exit(contract.HANG_EXIT)

    def wait_all_kept(self) -> None:
        """Wait (bounded) until every rank that answered the roll call has kept its state: the first rank to exit
        ends the step (srun --kill-on-bad-exit, torchrun), and a survivor still writing then meets the SIGKILL after
        KillWait on a loaded machine (CI, Slurm 22.05: the retry resumed from the checkpoint)."""
        if self.run_dir is None:
            return
        directory = self.run_dir / contract.HANG_DIR.format(restarts=self.restart)
        try:
            (directory / f"kept-{self.env.rank}").touch()
        except OSError:
            return
        deadline = time.monotonic() + COLLECT_S
        while time.monotonic() < deadline and not all((directory / f"kept-{r}").exists() for r in self.answered):
            time.sleep(0.2)

    def _roll_call(self, idle: float, since: str) -> None:
        rank, world = self.env.rank, self.env.world_size
        dump = dump_stacks(rank)
        if self.run_dir is None:
            sys.stderr.write(rollcall.format_dump(dump))
            sys.stderr.flush()
            return
        directory = self.run_dir / contract.HANG_DIR.format(restarts=self.restart)
        write_dump(directory, dump)
        _flight_recorder_dump(self.run_dir, rank)
        deadline, final = time.monotonic() + COLLECT_S, directory / "rollcall.txt"
        # (a rank whose watchdog fired later stops waiting once the first rank's roll call is out)
        while time.monotonic() < deadline and len(list(directory.glob("rank-*.json"))) < world and \
                not final.exists():
            time.sleep(0.5)
        dumps = read_dumps(directory)
        self.answered = answered = {d["rank"] for d in dumps}
        if rank == min(answered, default=rank):
            hellos = read_hellos(self.run_dir, self.restart)
            missing = {r: (f"{node_of(r, self.env, hellos, self.environ)}: no dump; busy in native code holding "
                           "Python's lock, stopped, or gone" if r in hellos else
                           f"{node_of(r, self.env, hellos, self.environ)}: never started")
                       for r in range(world) if r not in answered}
            call = rollcall.build(dumps, world, missing)
            call["since"], call["idle_s"] = since, round(idle)
            call["summary"] = f"hung since {since}: {call['summary']}"
            write_atomic(directory / "rollcall.json", json.dumps(call, indent=1))
            write_atomic(final, rollcall.format_text(call))
            sys.stderr.write(f"clusterddp: roll call ({rundir.shown(directory)}):\n{rollcall.format_text(call)}")
            sys.stderr.flush()
        else:
            deadline = time.monotonic() + COLLECT_S + 10
            while time.monotonic() < deadline and not final.exists():
                time.sleep(0.5)


def _flight_recorder_dump(run_dir: Path, rank: int) -> None:
    """NCCL jobs: write PyTorch's flight recorder (the last collectives) beside the stacks, as a timeout would."""
    if not int(os.environ.get("TORCH_NCCL_TRACE_BUFFER_SIZE", "0") or 0):
        return
    try:
        import torch

        c10d = torch._C._distributed_c10d  # private API: the name changed between releases; absent in CPU builds
        dump = getattr(c10d, "_dump_nccl_trace", None) or c10d._dump_fr_trace  # type: ignore[attr-defined]
        data = dump()
    except Exception:
        return
    prefix = os.environ.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE") or str(run_dir / contract.NCCL_TRACE_DIR / "rank_")
    try:
        Path(prefix + str(rank)).parent.mkdir(parents=True, exist_ok=True)
        Path(prefix + str(rank)).write_bytes(data)
    except OSError:
        pass
