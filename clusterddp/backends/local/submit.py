"""A local run, start to end: its directory, port and GPUs, then the attempts (the batch script's retry loop on
this machine: after an emulated node's fault, again from the last checkpoint on healthy emulated nodes)."""
from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Callable, List, Optional, Sequence, Tuple

from ... import contract
from ...contract import default_port
from ...healing.faults import FaultKind, native_abort
from ...job.spec import JobSpec
from .plan import Plan, describe, make_plan, pick_port, visible_gpus
from .run import run_plan


def node_name(emulated: int) -> str:
    return f"local{emulated}"


def node_at_fault(plan: Plan, outcome: dict) -> Optional[int]:
    """The attempt's node (index into the plan's nodes) at fault, as faults.py tells it on Slurm: the process that
    failed first was ended by a signal (not our SIGTERM), or it is a torchrun agent whose earliest root cause is."""
    import signal

    from ...healing.faults import torchrun_roots

    first, code = outcome.get("first"), outcome.get("returncode")
    if first is None or code is None:
        return None
    proc = plan.procs[first]
    if code < 0 and code != -signal.SIGTERM:
        return proc.node
    roots = torchrun_roots([Path(proc.log)]) if plan.spec.launcher == "torchrun" else []
    exit_ = roots[0].get("exitcode", "").split()[0] if roots and roots[0].get("exitcode") else ""
    if exit_.lstrip("-").isdigit() and int(exit_) < 0 and int(exit_) != -signal.SIGTERM:
        return proc.node
    return None


def run_attempts(spec: JobSpec, run_dir: str, port: int, job_id: int, gpus: Sequence[str], quiet: bool,
                 echo: Callable[[str], None], note: Callable[[str], None],
                 drill_env: Sequence[Tuple[str, str]] = ()) -> int:
    """The batch script's retry loop on this machine: after a node fault (an emulated node's ranks ended by a
    signal), the job runs again from its last checkpoint on healthy emulated nodes, a spare first."""
    from ...healing import attempts

    healthy, attempt, used = list(range(spec.alloc_nodes)), 0, 0
    while True:
        chosen = healthy[:spec.nodes]
        plan = make_plan(spec, run_dir, port, job_id, gpus, chosen)
        if drill_env:
            plan = dataclasses.replace(plan, common=plan.common + tuple(drill_env))
        if attempt:
            note(f"clusterddp: attempt {attempt + 1} on {','.join(node_name(i) for i in chosen)} (MASTER_PORT {port})")
        outcome: dict = {}
        start = int(time.time())
        code = run_plan(plan, quiet, echo, note, outcome)
        bad = node_at_fault(plan, outcome) if code not in (0, contract.EXIT["INTERRUPTED"]) else None
        names = tuple(node_name(i) for i in chosen)
        record = attempts.Attempt(0, attempt, start, int(time.time()), names, code, "", (), "", contract.NEXT_END)
        native = native_abort(Path(plan.procs[outcome["first"]].log)) if bad is not None else None
        if native is not None:  # std::terminate in the program's own native code: not the node (faults.py)
            bad, record = None, record._replace(fault=native.kind, why=native.why)
            note(f"clusterddp: {native.line()}")
        if bad is not None:
            record = record._replace(fault=FaultKind.INFRASTRUCTURE, fault_nodes=(names[bad],),
                                     why=f"{plan.procs[outcome['first']].label} ended by a signal, no Python traceback")
        again = bad is not None and used < spec.retries and len(healthy) > spec.nodes
        if spec.retries or spec.spare_nodes:
            attempts.append(Path(run_dir), record._replace(next=contract.NEXT_RETRY if again else contract.NEXT_END))
        if not again or bad is None:
            if bad is not None:
                why = (f"{used} of --retries {spec.retries} used" if used >= spec.retries
                       else "no healthy emulated node left (--spare-nodes adds some)")
                note(f"clusterddp: not retried: {why}")
            return code
        kept = attempts.set_aside(Path(run_dir), 0, attempt)
        healthy.remove(chosen[bad])
        used, attempt = used + 1, attempt + 1
        port = pick_port(port + 1)
        note(f"clusterddp: {record.line()}")
        note(f"clusterddp: the failed attempt's logs: {kept}/; retrying without {names[bad]} (retry {used} of "
             f"{spec.retries}), from the last checkpoint")


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
    return describe(make_plan(spec, run_dir, port, job_id, gpus))


def submit_local(spec: JobSpec, quiet: bool = False, echo: Callable[[str], None] = print,
                 note: Callable[[str], None] = print, prepare: Callable[[str], object] = lambda run_dir: None,
                 drill_env: Sequence[Tuple[str, str]] = ()) -> int:
    """The local equivalent of sbatch + wait: returns the job's exit code. (Callers say what it does not apply:
    LocalBackend.not_applied.)"""
    run_dir, port, job_id, gpus = _where(spec)
    prepare(run_dir)  # (a sweep writes its trial's file there)
    return run_attempts(spec, run_dir, port, job_id, gpus, quiet, echo, note, drill_env)
