"""Running a local plan (plan.py makes it): start every process, copy their output to the logs and the terminal,
stop them together on a failure, Ctrl-C or SIGTERM; SIGUSR2 asks the ranks to checkpoint, as a Slurm time limit
does."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

from ... import contract
from ...contract import without_parent_job
from ...errors import LocalRunError

if TYPE_CHECKING:
    from .plan import Plan

KILL_GRACE_S = 5.0  # SIGTERM, then this long, then SIGKILL
AGENTS_GRACE_S = 5.0  # after a torchrun agent failed, how long the others may take to end (and report) by themselves
# torchrun's line prefix (contract.TORCHRUN_PREFIX) with the local rank captured
_DEFAULT_PREFIX = re.compile("^" + re.escape(contract.TORCHRUN_PREFIX).replace(re.escape("{local_rank}"), r"(\d+)"))


class _Runner:
    """Starts the plan's processes, copies their output to logs and the terminal, ends them together."""

    def __init__(self, plan: "Plan", quiet: bool, echo: Callable[[str], None]) -> None:
        self.plan, self.quiet, self.echo = plan, quiet, echo
        self.popens: List[subprocess.Popen] = []
        self.lock = threading.Lock()

    def start(self) -> None:
        # A job started from inside a Slurm allocation must not inherit that job's variables.
        base = without_parent_job(os.environ)
        for name in contract.DRILL_VARIABLES:  # the drill's, only where it gave them (plan.common)
            base.pop(name, None)
        base.update(self.plan.common)
        for p in self.plan.procs:
            env = dict(base)
            env.update(p.env)
            try:
                popen = subprocess.Popen(list(p.argv), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
            except OSError as exc:
                self.stop()
                raise LocalRunError(f"cannot start {p.argv[0]}: {exc.strerror}") from None
            self.popens.append(popen)
        self.threads = [threading.Thread(target=self._pump, args=(i,), daemon=True) for i in range(len(self.popens))]
        for t in self.threads:
            t.start()

    def _prefix(self, i: int, line: str) -> Tuple[str, str, Optional[int]]:
        p = self.plan.procs[i]
        if p.rank is not None:
            return f"[rank {p.rank}] ", line, p.rank
        m = _DEFAULT_PREFIX.match(line)
        if m:
            rank = i * self.plan.spec.tasks_per_node + int(m.group(1))  # (agent i: node rank i, given)
            return f"[rank {rank}] ", line[m.end():], rank
        return f"[{p.label}] ", line, None

    def _pump(self, i: int) -> None:
        popen, p = self.popens[i], self.plan.procs[i]
        assert popen.stdout is not None
        with open(p.log, "ab") as log:
            for raw in iter(popen.stdout.readline, b""):
                log.write(raw)
                log.flush()
                text = raw.decode("utf-8", "replace").rstrip("\n")
                prefix, body, rank = self._prefix(i, text)
                if self.quiet and rank != 0:
                    continue
                with self.lock:
                    self.echo(prefix + body)

    def wait(self) -> Tuple[int, Optional[int]]:
        """Until all exit 0 or one fails (then end the rest). Returns (exit code, index of the first failure)."""
        while True:
            codes = [p.poll() for p in self.popens]
            failed = [i for i, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                # Seen in one poll: a process ended by a signal (not our SIGTERM) is the cause, the others' errors
                # its collateral (a peer gone), as faults.py reads srun and torchrun.
                signalled = [i for i in failed if (codes[i] or 0) < 0 and codes[i] != -signal.SIGTERM]
                first = (signalled or failed)[0]
                # Which processes the cause ended: a node's ranks die within moments of each other (a second look
                # after 0.2 s), what stop() kills after its grace is not the cause. torchrun's agents all end with 1
                # whatever ended their workers, each writing its report (local_fault reads them all): the agent of
                # the node at fault may end after the survivors' on a loaded machine, so the agents get a moment
                # to end by themselves before stop() ends what is left (a SIGTERMed agent reports nothing).
                deadline = time.monotonic() + (AGENTS_GRACE_S if self.plan.spec.launcher == "torchrun" else 0.2)
                time.sleep(0.2)
                while time.monotonic() < deadline and any(p.poll() is None for p in self.popens):
                    time.sleep(0.05)
                self.seen = [p.poll() for p in self.popens]
                self.stop()
                return codes[first] or 1, first
            if all(c == 0 for c in codes):
                return 0, None
            time.sleep(0.05)

    def stop(self) -> None:
        """SIGTERM every process group we started, SIGKILL what is left after a grace period, descendants in
        other sessions included."""
        # torchrun starts each worker in a session of its own, out of reach of the agent's group; a worker that
        # ignores SIGTERM (a rank that asked for should_stop()) would outlive its agent's SIGKILL, orphaned and
        # holding its GPU. So every descendant is listed now, while the agents still are their parents.
        below = _descendants([p.pid for p in self.popens])
        for p in self.popens:
            if p.poll() is None:
                _signal_group(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + KILL_GRACE_S
        for p in self.popens:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for p in self.popens:
            _signal_group(p.pid, signal.SIGKILL)  # also children that outlived their parent
        for pid, started in below:
            if start_time(pid) == started:  # still that process, not a new one with a reused pid
                _kill(pid)
        for p in self.popens:
            p.wait()

    def join_output(self) -> None:
        for t in getattr(self, "threads", []):
            t.join(timeout=5)


def start_time(pid: int) -> Optional[str]:
    """The process's start time (field 22 of /proc/PID/stat), None once it is gone: tells a pid's reuse apart."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        return None


def _descendants(roots: List[int]) -> List[Tuple[int, str]]:
    """Every living process below ``roots`` as (pid, start time), from /proc (Linux; elsewhere none)."""
    children: Dict[int, List[int]] = {}
    try:
        entries = [e for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        return []
    for entry in entries:
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                ppid = int(fh.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found: List[Tuple[int, str]] = []
    todo = list(roots)
    while todo:
        for child in children.get(todo.pop(), []):
            started = start_time(child)
            if started is not None:
                found.append((child, started))
                todo.append(child)
    return found


def _kill(pid: int) -> None:
    """SIGKILL one process, and its group where it leads one (a torchrun worker's own session)."""
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def own_run_dir(path: Path) -> None:
    """Refuse a run directory that is not the job's own, as the batch script's supervisor does (datafiles.own_run_dir:
    a link, another user's, one others can write, or below a directory others could swap it in)."""
    from ...datafiles import NotOwned
    from ...datafiles import own_run_dir as check

    try:
        check(path)
    except NotOwned as exc:
        raise LocalRunError(f"the run directory {path} is not this job's own ({exc}): refusing to use it; choose "
                            "another --output-dir") from None


def run_plan(plan: "Plan", quiet: bool = False, echo: Callable[[str], None] = print,
             note: Callable[[str], None] = print, outcome: Optional[Dict[str, Any]] = None) -> int:
    """Run the plan to its end; returns the job's exit code (130 after Ctrl-C). ``outcome`` gets the index of the
    process that failed first and its return code ("first", "returncode")."""
    own_run_dir(Path(plan.run_dir))
    trace = dict(plan.common).get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
    if trace:  # torch opens its dump file without making the directory: no directory, no dump
        Path(trace).parent.mkdir(parents=True, exist_ok=True)
    note(plan.note)
    runner = _Runner(plan, quiet, echo)
    previous = signal.getsignal(signal.SIGTERM)

    def on_term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    def on_usr2(signum: int, frame: object) -> None:
        # As at a Slurm time limit: ask every rank to checkpoint and stop (clusterddp.runtime.should_stop()).
        Path(dict(plan.common)[contract.STOP_FILE]).touch()
        note("clusterddp: SIGUSR2: asked every rank to checkpoint and stop")

    signal.signal(signal.SIGTERM, on_term)
    previous_usr2 = signal.signal(signal.SIGUSR2, on_usr2)
    try:
        runner.start()
        code, first = runner.wait()
    except KeyboardInterrupt:
        runner.stop()
        runner.join_output()
        note(f"clusterddp: interrupted; stopped all {len(runner.popens)} processes (logs in {plan.run_dir}/)")
        return contract.EXIT["INTERRUPTED"]
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGUSR2, previous_usr2)
    runner.join_output()
    if first is not None and outcome is not None:
        outcome.update(first=first, returncode=runner.popens[first].returncode)
        outcome["codes"] = list(getattr(runner, "seen", []))
    if first is not None:
        from ...healing.logscan import summary, tracebacks
        from ...rollcall import runtime_failure

        ended = runtime_failure(Path(plan.run_dir))
        if ended is not None:
            note(ended[1])
            return ended[0]
        note(f"clusterddp: {plan.procs[first].label} exited with code {code}; stopped the others")
        found = tracebacks(sorted(Path(plan.run_dir).glob("*.out")))
        note(summary(found, plan.run_dir))
    return code


SERVER_START_S = 30.0  # as warm.sh.j2: how long the first attempt waits for each server to say it started


def start_servers(procs: List[Any], note: Callable[[str], None], started: List[subprocess.Popen]) -> None:
    """The run's warm servers (plan.warm_servers), each in a session of its own, its output to its log, added to
    ``started`` as each starts (so that whatever ends the wait can stop them); returns once each has said it started
    (it then imports torch while the ranks' clients wait for it: warmrun.py). Each goes with this process if it dies
    (Linux's parent-death signal): no server outlives its run."""
    base = without_parent_job(os.environ)
    logs = []
    for p in procs:
        Path(p.log).parent.mkdir(parents=True, exist_ok=True)
        offset = Path(p.log).stat().st_size if Path(p.log).exists() else 0  # (a restart's run directory: its own)
        with open(p.log, "ab") as log:
            try:
                started.append(subprocess.Popen(list(p.argv), env={**base, **dict(p.env)}, stdout=log,
                                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                                start_new_session=True, preexec_fn=_die_with_parent))
                logs.append((p.log, offset))
            except OSError as exc:
                note(f"clusterddp: warm server not started ({exc.strerror}): the ranks start cold")
    deadline = time.monotonic() + SERVER_START_S
    while time.monotonic() < deadline and not all(b": starting" in _read(log, offset) or popen.poll() is not None
                                                  for (log, offset), popen in zip(logs, started)):
        time.sleep(0.02)


def _die_with_parent() -> None:
    """In the server's child, before exec: SIGTERM when the runner goes (prctl PR_SET_PDEATHSIG; Linux only)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _read(path: str, offset: int) -> bytes:
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            return fh.read(4096)
    except OSError:
        return b""


def stop_servers(popens: List[subprocess.Popen]) -> None:
    """End the run's warm servers (SIGTERM, SIGKILL after the grace): they outlive the attempts, not the run."""
    for p in popens:
        if p.poll() is None:
            _signal_group(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + KILL_GRACE_S
    for p in popens:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal_group(p.pid, signal.SIGKILL)
            p.wait()
