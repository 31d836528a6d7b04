"""A local run, start to end: its directory, port and GPUs, then the attempts (the batch script's retry loop on
this machine: after an emulated node's fault, again from the last checkpoint on healthy emulated nodes)."""
from __future__ import annotations

import dataclasses
import os
import secrets
import signal
import socket
import time
from pathlib import Path
from typing import Any, Callable, List, Optional, Sequence, Tuple

from ... import contract
from ...contract import default_port
from ...datafiles import own_dir
from ...healing.faults import Fault
from ...job.ids import LOCAL
from ...job.spec import JobSpec
from .plan import Plan, describe, make_plan, pick_port, visible_gpus, warm_servers, warms
from .run import run_plan, start_servers, stop_servers


def node_name(emulated: int) -> str:
    return contract.LOCAL_NODE.format(index=emulated)


def _signame(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def local_fault(plan: Plan, outcome: dict, names: Sequence[str], restart: int = 0) -> Optional[Fault]:
    """The evidence of a failed local attempt, as faults.py reads it on Slurm: the process that failed first was
    ended by a signal (not our SIGTERM), or it is a torchrun agent whose earliest root cause was; how many of its
    emulated node's ranks the signal ended. None: nothing says it was not the program (never retried). The logs
    are this attempt's alone (a failed attempt's are set aside, a restart's at its start); ``restart``: the run's
    restart (its runtime records)."""
    from ...healing.faults import cite, signal_fault, torchrun_cause
    from ...healing.launchers import BY_SIGNUM, torchrun_roots

    first, code = outcome.get("first"), outcome.get("returncode")
    if first is None or code is None:
        return None
    proc, codes = plan.procs[first], outcome.get("codes") or []
    node = names[proc.node]
    if code < 0 and code != -signal.SIGTERM:
        lost = sum(1 for p, c in zip(plan.procs, codes) if p.node == proc.node and c is not None and c < 0
                   and c != -signal.SIGTERM)
        rank = proc.rank if proc.rank is not None else proc.node
        return signal_fault(BY_SIGNUM.get(code, "Killed"), node, str(rank), [rank], [Path(proc.log)],
                            plan.spec.tasks_per_node, max(1, lost))._replace(
            evidence=f"the local runner's wait: {'rank' if proc.rank is not None else 'agent'} {rank} on {node} ended "
                     f"by {_signame(-code)}, {lost} of the node's processes by a signal")
    if plan.spec.launcher != "torchrun":
        return None
    # Where a rank's error is a cause of its own, the first agent to end tells, as before (a tie in its second: the
    # signal first). Where every error only reacts to a lost peer, every agent's report is read: the killed
    # workers' agent can end after the survivors' on a loaded machine (its root cause's time is when it looked).
    logs = [Path(p.log) for p in plan.procs]
    primary = _primary(logs, plan, restart)
    root = torchrun_cause(torchrun_roots([Path(proc.log)] if primary else logs), {path.name: path for path in logs},
                          primary=primary)
    if root is None:
        return None
    proc = next(p for p in plan.procs if Path(p.log).name == root["log"])
    exit_, rank = root["exitcode"].split()[0], root.get("rank", "?").split()[0]
    gone = [c for c in root.get("failed", []) if c < 0 and c != -signal.SIGTERM]
    return signal_fault(BY_SIGNUM.get(int(exit_), "Killed"), names[proc.node], rank,
                        [int(rank)] if rank.isdigit() else [], [Path(proc.log)], plan.spec.tasks_per_node,
                        max(1, len(gone)))._replace(
        evidence=cite(Path(proc.log).name, f"torchrun's root cause: rank {rank}, exitcode {exit_}"))


def _primary(logs: List[Path], plan: Plan, restart: int) -> bool:
    """Some rank's error of this attempt is a cause of its own, not a reaction to a lost peer (the runtime's records,
    else the logs' tracebacks)."""
    from ...healing.faults import recorded
    from ...healing.logscan import tracebacks

    return bool(recorded(Path(plan.run_dir), restart)) or any(not t.secondary for t in tracebacks(logs))


def run_attempts(spec: JobSpec, run_dir: str, port: int, job_id: int, gpus: Sequence[str], quiet: bool,
                 echo: Callable[[str], None], note: Callable[[str], None],
                 drill_env: Sequence[Tuple[str, str]] = (), restart: int = 0) -> int:
    """The batch script's attempt loop on this machine, decided by the same supervisor (healing/supervise.py):
    after a node fault (an emulated node's ranks ended by a signal) the job runs again from its last checkpoint
    on healthy emulated nodes, a spare first; after an ambiguous one once in place. (No requeue, no health gate.)
    The emulated allocation (every emulated node, from here to the end) is recorded for the goodput ledger."""
    from ...healing import attempts

    hosts = [node_name(i) for i in range(spec.alloc_nodes)]
    began = time.time()
    # (as warm.sh.j2 names its servers: this run's, made once for all its attempts, never one inherited)
    warm = f"local-{job_id}.{restart}.{secrets.token_hex(8)}" if warms(spec) else ""
    servers: List = []
    previous = _term_interrupts() if warm else None  # (a SIGTERM between attempts still stops the servers)
    try:
        if warm:
            start_servers(warm_servers(spec, run_dir, warm), note, servers)
        return _attempts(spec, run_dir, port, job_id, gpus, quiet, echo, note, drill_env, restart, hosts, warm)
    finally:
        stop_servers(servers)
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        if Path(run_dir).is_dir():  # (made by the first attempt)
            attempts.began(Path(run_dir), restart, began, hosts)
            attempts.ended(Path(run_dir), restart, time.time())


def _term_interrupts() -> Any:
    """SIGTERM raises KeyboardInterrupt here, as run_plan has it during an attempt; the handler before, or None
    (not the main thread: nothing changed)."""
    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    try:
        return signal.signal(signal.SIGTERM, interrupt)
    except ValueError:
        return None


def _attempts(spec: JobSpec, run_dir: str, port: int, job_id: int, gpus: Sequence[str], quiet: bool,
              echo: Callable[[str], None], note: Callable[[str], None], drill_env: Sequence[Tuple[str, str]],
              restart: int, hosts: List[str], warm: str = "") -> int:
    from ...healing import attempts, supervise
    from ...healing.faults import after_work

    policy = supervise.Policy(spec.nodes, spec.tasks_per_node, spec.retries, local=True)
    chosen: Tuple[str, ...] = tuple(hosts[:spec.nodes])
    bad: Tuple[str, ...] = ()
    attempt = 0
    while True:
        plan = make_plan(spec, run_dir, port, job_id, gpus, [hosts.index(n) for n in chosen], restart, warm)
        if drill_env:
            plan = dataclasses.replace(plan, common=plan.common + tuple(drill_env))
        if attempt:
            note(f"clusterddp: attempt {attempt + 1} on {','.join(chosen)} (MASTER_PORT {port})")
        outcome: dict = {}
        start = int(time.time())
        code = run_plan(plan, quiet, echo, note, outcome)
        fault = local_fault(plan, outcome, chosen, restart) \
            if code not in (0, contract.EXIT["INTERRUPTED"]) else None
        record = attempts.Attempt(restart, attempt, start, int(time.time()), chosen, code, "", (), "",
                                  contract.NEXT_END)
        if fault is None:
            attempts.append(Path(run_dir), record)
            return code
        fault = after_work(Path(run_dir), fault)
        note(f"clusterddp: attempt {attempt + 1} failed: {fault.line()}")
        action = supervise.after_failure(fault, history=attempts.read(Path(run_dir)), policy=policy, hosts=hosts,
                                         bad=bad, ran_on=chosen, restart=restart, room=None, exit_code=code)
        judged = action.fault or fault
        record = record._replace(fault=judged.kind, fault_nodes=judged.nodes, why=judged.why, next=action.next,
                                 evidence=judged.evidence)
        attempts.append(Path(run_dir), record)
        for line in action.say:
            note(line)
        picked = supervise.choose(hosts, action.bad, spec.nodes)
        if action.act not in (supervise.Act.GATE, supervise.Act.RUN) or picked is None:
            return code
        kept = attempts.set_aside(Path(run_dir), restart, attempt)
        note(f"clusterddp: the failed attempt's logs: {kept}/")
        chosen, bad, attempt = picked, action.bad, attempt + 1
        # A port anywhere in the span, not the next one: runs started together (the drill's scenarios side by side)
        # have ports a few apart, and the next one may be another run's, free only for the moment it is looked at.
        port = pick_port(contract.default_port(secrets.randbelow(1 << 30)))


def _where(spec: JobSpec) -> Tuple[str, int, int, List[str]]:
    """A new local run's directory, port, job id (this process's pid) and GPUs."""
    job_id = os.getpid()
    run_dir = os.path.join(spec.output_dir, f"{spec.file_stem}-local-{time.strftime('%Y%m%d-%H%M%S')}-{job_id}")
    if os.path.exists(run_dir):  # a second run within the second (a sweep's next trial)
        run_dir += f"-{sum(1 for _ in Path(spec.output_dir).glob(os.path.basename(run_dir) + '*'))}"
    port = spec.master_port or pick_port(default_port(job_id))
    return run_dir, port, job_id, visible_gpus() if spec.gpus_per_node else []


def dry_run(spec: JobSpec) -> str:
    """What a local run of ``spec`` would start, as shell lines (nothing is started)."""
    run_dir, port, job_id, gpus = _where(spec)
    warm = f"local-{job_id}.0.NAME" if warms(spec) else ""  # (its last part is random, made at the run's start)
    return describe(make_plan(spec, run_dir, port, job_id, gpus, warm=warm),
                    warm_servers(spec, run_dir, warm) if warm else ())


def submit_local(spec: JobSpec, quiet: bool = False, echo: Callable[[str], None] = print,
                 note: Callable[[str], None] = print, prepare: Callable[[str], object] = lambda run_dir: None,
                 drill_env: Sequence[Tuple[str, str]] = (), run_dir: Optional[str] = None,
                 job_id: Optional[str] = None) -> int:
    """The local equivalent of sbatch + wait: returns the job's exit code. (Callers say what it does not apply:
    LocalBackend.not_applied.) ``run_dir``: run again in that one (the next restart), as a requeued job does.
    ``job_id``: the run is filed under it (jobs.py), its own lines kept in RUN_DIR/runner.log."""
    from ...healing import attempts

    new_dir, port, pid, gpus = _where(spec)
    restart = 0
    if run_dir is not None:
        own_dir(run_dir)
        restart = max((a.restart + 1 for a in attempts.read(Path(run_dir))), default=0)
        if restart:  # (as a requeued job's: the last restart's logs to attempts/RESTART.end/, this one's apart)
            attempts.set_aside_logs(Path(run_dir), restart - 1)
    run_dir = run_dir or new_dir
    prepare(run_dir)  # (a sweep writes its trial's file there)
    from ...healing import identity
    from .run import own_run_dir

    own_run_dir(Path(run_dir))
    # (the trackers' run id: this run's own, kept when the drill runs it again there as a requeue)
    identity.write(run_dir, f"{LOCAL}-{socket.gethostname()}", job_id or str(pid), restart)
    if job_id is None:
        return run_attempts(spec, run_dir, port, pid, gpus, quiet, echo, note, drill_env, restart)
    from . import jobs

    jobs.started(job_id, run_dir, spec)
    log = open(Path(run_dir) / contract.LOCAL_LOG, "a", encoding="utf-8")

    def logged(line: str) -> None:
        note(line)
        log.write(line + "\n")
        log.flush()
    code = contract.EXIT["RUNTIME"]
    try:
        code = run_attempts(spec, run_dir, port, pid, gpus, quiet, echo, logged, drill_env, restart)
        return code
    except KeyboardInterrupt:
        code = contract.EXIT["INTERRUPTED"]
        raise
    finally:
        log.close()
        jobs.ended(run_dir, code)
