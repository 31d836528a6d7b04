"""A local run as data: the processes each launcher would start on this machine, their environment and logs
(pure: the dry run prints it; run.py starts them, submit.py runs the attempts).

Each launcher is emulated honestly, without a layer of our own on top:
- torchrun: one torchrun agent per emulated node, as the batch script starts it (runtime/agent.py), at a static
  rendezvous on 127.0.0.1 (node ranks given);
- srun: one process per rank with the variables srun (and the srun template) would set;
- spawn: one process per emulated node running the script, placeholders filled in.
What is ours: starting those processes, their logs, and ending all of them when one fails or on Ctrl-C.
"""
from __future__ import annotations

import dataclasses
import os
import secrets
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, List, Optional, Sequence, Tuple

from ... import contract
from ...contract import PORT_BASE, PORT_SPAN, fill_placeholders, port_candidates
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
              emulated: Sequence[int] = (), restart: int = 0, warm: str = "") -> Plan:
    """Everything that will run, as data (pure: the dry run prints it). ``emulated``: which of the job's emulated
    nodes (its ``nodes`` and spares) this attempt uses, in order; their GPUs are theirs. ``warm``: the run's warm
    start name (warm_servers): each rank's process asks its emulated node's server to fork it."""
    n, per = spec.nodes, spec.tasks_per_node
    emulated = list(emulated) or list(range(n))
    use_gpus = spec.gpus_per_node > 0 and len(gpus_available) >= spec.alloc_nodes * per
    threads = spec.cpus_per_task or max(1, cpu_count() // spec.world_size)
    ranks, each = f"{spec.world_size} rank{'s' * (spec.world_size != 1)}", f"{threads} thread(s) per rank"
    if spec.gpus_per_node > 0 and not use_gpus:
        note = (f"clusterddp: {ranks} need{'s' * (spec.world_size == 1)} {spec.world_size} "
                f"GPU{'s' * (spec.world_size != 1)}, {len(gpus_available)} here: running on CPU with gloo, {each}")
    elif use_gpus:
        note = f"clusterddp: running {ranks} on GPUs {','.join(gpus_available[:spec.world_size])}"
    else:
        note = f"clusterddp: running {ranks} on CPU with gloo, {each}"

    def devices(node: int) -> List[Tuple[str, str]]:
        """Per emulated node: its name (as srun sets it in every task) and its GPUs."""
        first = emulated[node] * per
        named = [("SLURMD_NODENAME", contract.LOCAL_NODE.format(index=emulated[node]))]
        return named + ([("CUDA_VISIBLE_DEVICES", ",".join(gpus_available[first:first + per]))] if use_gpus else [])

    launch = {"torchrun": _torchrun_procs, "srun": _srun_procs, "spawn": _spawn_procs}[spec.launcher]
    procs = launch(spec, Path(run_dir), port, job_id, devices)
    if warm and warms(spec):  # the batch script's lines (srun.sh.j2, torchrun.sh.j2), on this machine
        procs = [dataclasses.replace(p, argv=_warm_argv(spec, p.argv)) for p in procs]
    gpus = [d for node in range(n) for name, ids in devices(node) if name == "CUDA_VISIBLE_DEVICES"
            for d in ids.split(",")] if use_gpus else None
    common = _common_env(spec, run_dir, port, threads, use_gpus, restart) + \
        ([(contract.WARM, warm)] if warm and warms(spec) else [])
    return Plan(spec, run_dir, port, gpus, tuple(common), tuple(procs), note)


WARM_RUN = ("-m", "clusterddp.runtime.warmrun")


def warms(spec: JobSpec) -> bool:
    """Whether a local run of ``spec`` forks its ranks from warm servers: asked for, and the job's Python is this
    one (the servers and clients are this clusterddp's modules)."""
    return spec.warm_start and _python(spec) == sys.executable


def _warm_argv(spec: JobSpec, argv: Sequence[str]) -> Tuple[str, ...]:
    """A rank's process as a client of its node's server; under torchrun the agent too, and each of its workers."""
    python, rest = argv[0], list(argv[1:])
    if spec.launcher == "torchrun":  # python -m AGENT --opts... PROGRAM -> the agent forked, its workers clients
        program = spec.program_argv()
        rest = rest[:len(rest) - len(program)] + ["--module", "clusterddp.runtime.warmrun", *program]
    return (python, *WARM_RUN, *rest)


def warm_servers(spec: JobSpec, run_dir: str, warm: str) -> List[Proc]:
    """One warm server per emulated node of the job (its spares too), as warm.sh.j2 starts one per node: it
    imports torch once and forks that node's ranks; its output in RUN_DIR/warm-NODE.out."""
    procs = []
    for index in range(spec.alloc_nodes):
        name = contract.LOCAL_NODE.format(index=index)
        procs.append(Proc(f"warm server {name}", (_python(spec), "-m", "clusterddp.runtime.warm", "serve"),
                          (("SLURMD_NODENAME", name), (contract.WARM, warm)),
                          str(Path(run_dir) / f"warm-{name}.out"), index))
    return procs


Devices = Callable[[int], List[Tuple[str, str]]]


def _python(spec: JobSpec) -> str:
    return sys.executable if spec.python == "python3" else spec.python


def _common_env(spec: JobSpec, run_dir: str, port: int, threads: int, use_gpus: bool,
                restart: int = 0) -> List[Tuple[str, str]]:
    """The environment of every process: what the batch script promises the ranks (contract.py)."""
    common: List[Tuple[str, str]] = [
        ("PYTHONUNBUFFERED", "1"), (contract.LOCAL, "1"), *spec.promised_env, (contract.RUN_DIR, run_dir),
        ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", str(port)),
        ("OMP_NUM_THREADS", str(threads)),
        (contract.STOP_FILE, str(Path(run_dir) / contract.STOP_FILE_NAME.format(restarts=restart))),
        (contract.RESTARTS, str(restart)),
        (contract.WATCH_KEY, secrets.token_hex(16)),  # a secret of this run (a new plan for every run)
    ]
    if not use_gpus:
        common.append(("CUDA_VISIBLE_DEVICES", ""))
    elif spec.flight_recorder:  # as the batch script does for NCCL jobs
        common += contract.flight_recorder(str(Path(run_dir) / contract.NCCL_TRACE_DIR / "rank_"), spec.env)
    common += list(spec.env)
    for trial in getattr(spec.sweep, "trials", ())[:1]:  # a sweep's trial: its parameters, as the batch script's
        common += [(contract.TRIAL, str(trial.index)), *trial.env()]
    return common


def _slurm_env(spec: JobSpec, job_id: int) -> List[Tuple[str, str]]:
    """What srun sets in every task of a step (the node list names this machine once per emulated node)."""
    n, nodelist = spec.nodes, ",".join(["localhost"] * spec.nodes)
    slurm = [("SLURM_JOB_ID", str(job_id)), ("SLURM_JOB_NODELIST", nodelist), ("SLURM_STEP_NODELIST", nodelist),
             ("SLURM_JOB_NUM_NODES", str(n)), ("SLURM_NNODES", str(n)), ("SLURM_STEP_NUM_NODES", str(n)),
             ("SLURM_STEP_ID", "0"), ("SLURM_STEPID", "0")]
    if spec.cpus_per_task:
        slurm.append(("SLURM_CPUS_PER_TASK", str(spec.slurm_cpus_per_task)))
    return slurm


def _torchrun_procs(spec: JobSpec, run: Path, port: int, job_id: int, devices: Devices) -> List[Proc]:
    """One torchrun agent (clusterddp.runtime.agent: torch.distributed.run) per emulated node, at a static rendezvous
    on 127.0.0.1 (node ranks given)."""
    n, per = spec.nodes, spec.tasks_per_node
    # (torch's own where --python names another interpreter, which may lack clusterddp: only torch is asked of it)
    agent = "clusterddp.runtime.agent" if _python(spec) == sys.executable else "torch.distributed.run"
    procs = []
    for node in range(n):
        argv = [_python(spec), "-m", agent, f"--nnodes={n}", f"--nproc-per-node={per}",
                # as on Slurm: a static rendezvous, node 0's agent holding the store, each agent's node rank given
                "--rdzv-backend=static", "--master-addr=127.0.0.1", f"--master-port={port}", f"--node-rank={node}",
                f"--rdzv-id=local-{job_id}",
                "--tee=3", f"--log-dir={run / 'torchrun' / f'node{node}'}", *spec.program_argv()]
        log = str(run / contract.NODE_LOG.format(node=node))
        procs.append(Proc(f"node {node}", tuple(argv), tuple(devices(node)), log, node))
    return procs


def _srun_procs(spec: JobSpec, run: Path, port: int, job_id: int, devices: Devices) -> List[Proc]:
    """One process per rank with the variables srun (and the srun template) would set."""
    n, per, ntasks = spec.nodes, spec.tasks_per_node, str(spec.world_size)
    procs = []
    for r in range(spec.world_size):
        node, local = divmod(r, per)
        env = _slurm_env(spec, job_id) + [
            ("SLURM_PROCID", str(r)), ("SLURM_LOCALID", str(local)), ("SLURM_NODEID", str(node)),
            ("SLURM_NTASKS", ntasks), ("SLURM_STEP_NUM_TASKS", ntasks), ("SLURM_NTASKS_PER_NODE", str(per)),
            ("SLURM_TASKS_PER_NODE", f"{per}(x{n})"), ("SLURM_STEP_TASKS_PER_NODE", f"{per}(x{n})"),
            # set per task by the srun template
            ("RANK", str(r)), ("LOCAL_RANK", str(local)), ("WORLD_SIZE", ntasks), ("LOCAL_WORLD_SIZE", str(per)),
            ("NODE_RANK", str(node))] + devices(node)
        log = str(run / contract.RANK_LOG.format(rank=r))
        procs.append(Proc(f"rank {r}", (_python(spec), *spec.program_argv()), tuple(env), log, node, r))
    return procs


def _spawn_procs(spec: JobSpec, run: Path, port: int, job_id: int, devices: Devices) -> List[Proc]:
    """One process per emulated node running the script, placeholders filled in."""
    n, program = spec.nodes, spec.program_argv()
    values = {"master_addr": "127.0.0.1", "master_port": str(port), "nnodes": str(n),
              "gpus_per_node": str(spec.tasks_per_node), "world_size": str(spec.world_size)}
    procs = []
    for node in range(n):
        filled = dict(values, node_rank=str(node))
        # Placeholders are filled in the script's arguments only, never in the script path (as in spawn.sh.j2).
        entry = program[:len(program) - len(spec.args)]
        args = entry + [fill_placeholders(a, filled) for a in spec.args]
        env = _slurm_env(spec, job_id) + [
            ("SLURM_PROCID", str(node)), ("SLURM_LOCALID", "0"), ("SLURM_NODEID", str(node)),
            ("SLURM_NTASKS", str(n)), ("SLURM_STEP_NUM_TASKS", str(n)), ("SLURM_NTASKS_PER_NODE", "1"),
            ("SLURM_TASKS_PER_NODE", f"1(x{n})"), ("NODE_RANK", str(node))] + devices(node)
        log = str(run / contract.NODE_LOG.format(node=node))
        procs.append(Proc(f"node {node}", (_python(spec), *args), tuple(env), log, node))
    return procs


def describe(plan: Plan, servers: Sequence[Proc] = ()) -> str:
    """The dry run: every command and its environment, as shell lines a user could run by hand."""
    q = shell_quote
    lines = [f"# clusterddp --local dry run: {plan.spec.nodes} node(s) x {plan.spec.tasks_per_node} = world size "
             f"{plan.spec.world_size} ({plan.spec.launcher} launcher); nothing is started",
             f"# {plan.note.replace('clusterddp: ', '')}", f"# logs in {plan.run_dir}/",
             "# environment of every process:"]
    lines += [f"export {k}={q(v)}" for k, v in plan.common]
    for p in servers:  # (started before the first attempt, ended after the last)
        lines.append(f"# {p.label}: imports torch once, forks its node's ranks (log {p.log})")
        lines.append(" ".join([f"{k}={q(v)}" for k, v in p.env] + [q(a) for a in p.argv]) + " &")
    for p in plan.procs:
        lines.append(f"# {p.label} (log {p.log})")
        lines.append(" ".join([f"{k}={q(v)}" for k, v in p.env] + [q(a) for a in p.argv]) + " &")
    lines.append("wait")
    return "\n".join(lines) + "\n"


#: Options that only mean something to Slurm (or inside a Slurm job), with the flag that sets them.
_SLURM_ONLY = (("setup", "--setup"), ("apptainer", "--apptainer"), ("container_image", "--container-image"),
               ("time", "--time"), ("mem", "--mem"), ("sbatch_args", "--sbatch-arg"), ("partition", "--partition"),
               ("account", "--account"), ("qos", "--qos"), ("constraint", "--constraint"), ("array", "--array"),
               ("after", "--after"), ("exclusive", "--exclusive"), ("expedite", "--expedite"))


def not_applied(spec: JobSpec) -> List[str]:
    """The options given in ``spec`` that a local run ignores (said in one line, never silently)."""
    return [flag for name, flag in _SLURM_ONLY if getattr(spec, name)] + \
        (["--warm-start (--python names another interpreter)"] if spec.warm_start and not warms(spec) else [])


def not_applied_line(spec: JobSpec) -> Optional[str]:
    """That line, or None when every option given applies."""
    skipped = not_applied(spec)
    return (f"clusterddp: --local does not apply {', '.join(skipped)}: they ask Slurm for resources or a "
            "container, and this run uses this machine as it is") if skipped else None


