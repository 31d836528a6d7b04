"""The local backend: the same job spec on this machine, no Slurm.

Each launcher is emulated honestly, without a layer of our own on top:
- torchrun: one torch.distributed.run agent per emulated node, meeting at a c10d rendezvous on 127.0.0.1;
- srun: one process per rank with the variables srun (and the srun template) would set;
- spawn: one process per emulated node running the script, placeholders filled in.
What is ours: starting those processes, their logs, and ending all of them when one fails or on Ctrl-C.
"""
from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, List, Optional, Sequence, Tuple

from ... import contract
from ...contract import PORT_BASE, PORT_SPAN, default_port, fill_placeholders, port_candidates
from ...errors import LocalRunError
from ...job.quoting import shell_quote
from ...job.spec import JobSpec


@dataclass(frozen=True)
class Proc:
    """One process the local backend starts."""

    label: str                        # "node 0" or "rank 3"
    argv: Tuple[str, ...]
    env: Tuple[Tuple[str, str], ...]  # added to this process's environment
    log: str
    node: int
    rank: Optional[int] = None        # the rank, when the process is one rank (srun emulation)


@dataclass(frozen=True)
class Plan:
    spec: JobSpec
    run_dir: str
    port: int
    gpus: Optional[List[str]]         # device ids used, or None for CPU/gloo
    common: Tuple[Tuple[str, str], ...]
    procs: Tuple[Proc, ...] = field(default=())
    note: str = ""


def visible_gpus() -> List[str]:
    """GPU ids on this machine without importing torch: CUDA_VISIBLE_DEVICES, else ``nvidia-smi -L``."""
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None:
        return [d for d in cvd.split(",") if d.strip() and d.strip() != "-1"]
    if not shutil.which("nvidia-smi"):
        return []
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [str(i) for i, line in enumerate(x for x in out.splitlines() if x.startswith("GPU "))]


def pick_port(preferred: int) -> int:
    """The preferred port when free on 127.0.0.1, else the next free one in 20000-29999 (outside ephemeral ports)."""
    for port in port_candidates(preferred):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise LocalRunError(f"no free port in {PORT_BASE}-{PORT_BASE + PORT_SPAN - 1} on 127.0.0.1")


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def make_plan(spec: JobSpec, run_dir: str, port: int, job_id: int, gpus_available: Sequence[str],
              emulated: Sequence[int] = ()) -> Plan:
    """Everything that will run, as data (pure: the dry run prints it). ``emulated``: which of the job's emulated
    nodes (its ``nodes`` and spares) this attempt uses, in order; their GPUs are theirs."""
    n, per = spec.nodes, spec.tasks_per_node
    emulated = list(emulated) or list(range(n))
    use_gpus = spec.gpus_per_node > 0 and len(gpus_available) >= spec.alloc_nodes * per
    threads = spec.cpus_per_task or max(1, cpu_count() // spec.world_size)
    if spec.gpus_per_node > 0 and not use_gpus:
        note = (f"clusterddp: {spec.world_size} ranks need {spec.world_size} GPUs, {len(gpus_available)} here: "
                f"running on CPU with gloo, {threads} thread(s) per rank")
    elif use_gpus:
        note = f"clusterddp: running {spec.world_size} ranks on GPUs {','.join(gpus_available[:spec.world_size])}"
    else:
        note = f"clusterddp: running {spec.world_size} ranks on CPU with gloo, {threads} thread(s) per rank"
    python = sys.executable if spec.python == "python3" else spec.python
    common: List[Tuple[str, str]] = [
        ("PYTHONUNBUFFERED", "1"), (contract.LOCAL, "1"), (contract.LAUNCHER, spec.launcher),
        (contract.NNODES, str(n)), (contract.GPUS_PER_NODE, str(spec.gpus_per_node)),
        (contract.PROCS_PER_NODE, str(per)), (contract.WORLD_SIZE, str(spec.world_size)),
        (contract.RUN_DIR, run_dir), ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", str(port)),
        ("OMP_NUM_THREADS", str(threads)),
        (contract.STOP_FILE, str(Path(run_dir) / contract.STOP_FILE_NAME.format(restarts=0))),
        (contract.RESTARTS, "0"), (contract.HANG_TIMEOUT, str(spec.hang_timeout_seconds)),
        (contract.WATCH_KEY, secrets.token_hex(16)),  # a secret of this run (a new plan for every run)
    ]
    if not use_gpus:
        common.append(("CUDA_VISIBLE_DEVICES", ""))
    elif spec.flight_recorder:  # as the batch script does for NCCL jobs
        common += contract.flight_recorder(str(Path(run_dir) / contract.NCCL_TRACE_DIR / "rank_"), spec.env)
    common += list(spec.env)
    for trial in getattr(spec.sweep, "trials", ())[:1]:  # a sweep's trial: its parameters, as the batch script's
        common += [(contract.TRIAL, str(trial.index)), *trial.env()]
    program = spec.program_argv()
    nodelist = ",".join(["localhost"] * n)
    # What srun sets in every task of a step (the node list names this machine once per emulated node).
    slurm = [("SLURM_JOB_ID", str(job_id)), ("SLURM_JOB_NODELIST", nodelist), ("SLURM_STEP_NODELIST", nodelist),
             ("SLURM_JOB_NUM_NODES", str(n)), ("SLURM_NNODES", str(n)), ("SLURM_STEP_NUM_NODES", str(n)),
             ("SLURM_STEP_ID", "0"), ("SLURM_STEPID", "0")]
    if spec.cpus_per_task:
        slurm.append(("SLURM_CPUS_PER_TASK", str(spec.slurm_cpus_per_task)))

    def devices(node: int) -> List[Tuple[str, str]]:
        first = emulated[node] * per
        return [("CUDA_VISIBLE_DEVICES", ",".join(gpus_available[first:first + per]))] if use_gpus else []

    procs: List[Proc] = []
    run = Path(run_dir)
    if spec.launcher == "torchrun":
        for node in range(n):
            argv = [python, "-m", "torch.distributed.run", f"--nnodes={n}", f"--nproc-per-node={per}",
                    "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id=local-{job_id}",
                    "--tee=3", f"--log-dir={run / 'torchrun' / f'node{node}'}", *program]
            log = str(run / contract.NODE_LOG.format(node=node))
            procs.append(Proc(f"node {node}", tuple(argv), tuple(devices(node)), log, node))
    elif spec.launcher == "srun":
        ntasks = str(spec.world_size)
        for r in range(spec.world_size):
            node, local = divmod(r, per)
            env = slurm + [("SLURM_PROCID", str(r)), ("SLURM_LOCALID", str(local)), ("SLURM_NODEID", str(node)),
                           ("SLURM_NTASKS", ntasks), ("SLURM_STEP_NUM_TASKS", ntasks),
                           ("SLURM_NTASKS_PER_NODE", str(per)), ("SLURM_TASKS_PER_NODE", f"{per}(x{n})"),
                           ("SLURM_STEP_TASKS_PER_NODE", f"{per}(x{n})"),
                           # set per task by the srun template
                           ("RANK", str(r)), ("LOCAL_RANK", str(local)), ("WORLD_SIZE", ntasks),
                           ("LOCAL_WORLD_SIZE", str(per)), ("NODE_RANK", str(node))] + devices(node)
            log = str(run / contract.RANK_LOG.format(rank=r))
            procs.append(Proc(f"rank {r}", (python, *program), tuple(env), log, node, r))
    else:  # spawn
        values = {"master_addr": "127.0.0.1", "master_port": str(port), "nnodes": str(n), "gpus_per_node": str(per),
                  "world_size": str(spec.world_size)}
        for node in range(n):
            filled = dict(values, node_rank=str(node))
            # Placeholders are filled in the script's arguments only, never in the script path (as in spawn.sh.j2).
            entry = program[:len(program) - len(spec.args)]
            args = entry + [fill_placeholders(a, filled) for a in spec.args]
            env = slurm + [("SLURM_PROCID", str(node)), ("SLURM_LOCALID", "0"), ("SLURM_NODEID", str(node)),
                           ("SLURM_NTASKS", str(n)), ("SLURM_STEP_NUM_TASKS", str(n)), ("SLURM_NTASKS_PER_NODE", "1"),
                           ("SLURM_TASKS_PER_NODE", f"1(x{n})"), ("NODE_RANK", str(node))] + devices(node)
            log = str(run / contract.NODE_LOG.format(node=node))
            procs.append(Proc(f"node {node}", (python, *args), tuple(env), log, node))
    gpus = [d for node in range(n) for _, ids in devices(node) for d in ids.split(",")] if use_gpus else None
    return Plan(spec, run_dir, port, gpus, tuple(common), tuple(procs), note)


def describe(plan: Plan) -> str:
    """The dry run: every command and its environment, as shell lines a user could run by hand."""
    q = shell_quote
    lines = [f"# clusterddp --local dry run: {plan.spec.nodes} node(s) x {plan.spec.tasks_per_node} = world size "
             f"{plan.spec.world_size} ({plan.spec.launcher} launcher); nothing is started",
             f"# {plan.note.replace('clusterddp: ', '')}", f"# logs in {plan.run_dir}/",
             "# environment of every process:"]
    lines += [f"export {k}={q(v)}" for k, v in plan.common]
    for p in plan.procs:
        lines.append(f"# {p.label} (log {p.log})")
        lines.append(" ".join([f"{k}={q(v)}" for k, v in p.env] + [q(a) for a in p.argv]) + " &")
    lines.append("wait")
    return "\n".join(lines) + "\n"


#: Options that only mean something to Slurm (or inside a Slurm job), with the flag that sets them.
_SLURM_ONLY = (("setup", "--setup"), ("apptainer", "--apptainer"), ("container_image", "--container-image"),
               ("time", "--time"), ("mem", "--mem"), ("sbatch_args", "--sbatch-arg"), ("partition", "--partition"),
               ("account", "--account"), ("qos", "--qos"), ("constraint", "--constraint"), ("array", "--array"),
               ("after", "--after"), ("exclusive", "--exclusive"))


def not_applied(spec: JobSpec) -> List[str]:
    """The options given in ``spec`` that a local run ignores (said in one line, never silently)."""
    return [flag for name, flag in _SLURM_ONLY if getattr(spec, name)]


def run(plan: Plan, quiet: bool = False, echo: Callable[[str], None] = print,
        note: Callable[[str], None] = print, outcome: Optional[dict] = None) -> int:
    """Run the plan to its end; returns the job's exit code (130 after Ctrl-C). See local_run.py."""
    from .run import run_plan

    return run_plan(plan, quiet, echo, note, outcome)


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
                 echo: Callable[[str], None], note: Callable[[str], None]) -> int:
    """The batch script's retry loop on this machine: after a node fault (an emulated node's ranks ended by a
    signal), the job runs again from its last checkpoint on healthy emulated nodes, a spare first."""
    from ...healing import attempts

    healthy, attempt, used = list(range(spec.alloc_nodes)), 0, 0
    while True:
        chosen = healthy[:spec.nodes]
        plan = make_plan(spec, run_dir, port, job_id, gpus, chosen)
        if attempt:
            note(f"clusterddp: attempt {attempt + 1} on {','.join(node_name(i) for i in chosen)} (MASTER_PORT {port})")
        outcome: dict = {}
        start = int(time.time())
        code = run(plan, quiet=quiet, echo=echo, note=note, outcome=outcome)
        bad = node_at_fault(plan, outcome) if code not in (0, contract.EXIT["INTERRUPTED"]) else None
        names = tuple(node_name(i) for i in chosen)
        record = attempts.Attempt(0, attempt, start, int(time.time()), names, code, "", (), "", contract.NEXT_END)
        if bad is not None:
            record = record._replace(fault="infrastructure", fault_nodes=(names[bad],),
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


def submit_local(spec: JobSpec, quiet: bool = False, dry_run: bool = False, echo: Callable[[str], None] = print,
                 note: Callable[[str], None] = print, prepare: Callable[[str], object] = lambda run_dir: None) -> int:
    """The local equivalent of sbatch + wait: returns the exit code (0 after a dry run)."""
    skipped = not_applied(spec)
    if skipped:
        note(f"clusterddp: --local does not apply {', '.join(skipped)}: they ask Slurm for resources or a "
             "container, and this run uses this machine as it is")
    job_id = os.getpid()
    run_dir = os.path.join(spec.output_dir, f"{spec.file_stem}-local-{time.strftime('%Y%m%d-%H%M%S')}-{job_id}")
    if os.path.exists(run_dir):  # a second run within the second (a sweep's next trial)
        run_dir += f"-{sum(1 for _ in Path(spec.output_dir).glob(os.path.basename(run_dir) + '*'))}"
    port = spec.master_port or pick_port(default_port(job_id))
    gpus = visible_gpus() if spec.gpus_per_node else []
    if dry_run:
        echo(describe(make_plan(spec, run_dir, port, job_id, gpus)).rstrip("\n"))
        return 0
    prepare(run_dir)  # (a sweep writes its trial's file there)
    return run_attempts(spec, run_dir, port, job_id, gpus, quiet, echo, note)
