"""The job: one frozen, validated :class:`JobSpec`, the contract between the CLI, the templates, the local
backend and the Python API. Everything derived (world size, the #SBATCH directives) is computed here once.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, List, Mapping, Optional, Sequence, Tuple

from .. import contract
from ..errors import SpecError
from . import sbatch_options, validate
from .parse import parse_env, parse_time, slug
from .quoting import path_word, sbatch_quote
from .validate import GPU_REQUESTS, LAUNCHERS, MAX_RETRIES  # noqa: F401 (their home is validate.py)

if TYPE_CHECKING:  # (a job without an array never defines its dataclasses: start-up time)
    from .array import JobArray


@dataclass(frozen=True)
class JobSpec:
    """A distributed training job: what to run, on how many nodes and GPUs, and how to launch it.

    Field names follow sbatch's long options. ``gpus_per_node=0`` is a CPU-only job with ``procs_per_node``
    processes per node (gloo). ``cpus_per_task`` is CPUs per *rank*, whatever the launcher.
    """

    script: str = ""
    args: Tuple[str, ...] = ()
    module: bool = False
    nodes: int = 1
    gpus_per_node: int = 0
    procs_per_node: Optional[int] = None
    cpus_per_task: Optional[int] = None
    mem: Optional[str] = None
    time: Optional[str] = None
    partition: Optional[str] = None
    account: Optional[str] = None
    qos: Optional[str] = None
    constraint: Optional[str] = None
    exclusive: bool = False
    job_name: Optional[str] = None
    output_dir: str = "clusterddp-runs"
    env: Tuple[Tuple[str, str], ...] = ()
    setup: Tuple[str, ...] = ()
    sbatch_args: Tuple[str, ...] = ()
    gpu_request: str = "gpus-per-node"
    launcher: str = "torchrun"
    master_port: Optional[int] = None
    python: str = "python3"
    template: Optional[str] = None
    container_image: Optional[str] = None
    apptainer: Optional[str] = None
    array: Optional[str] = None
    after: Tuple[str, ...] = ()
    exclude: Tuple[str, ...] = ()
    requeue: Optional[bool] = None
    max_requeues: int = 3
    expedite: Optional[bool] = None  # Slurm 25.11's expedited requeue; None: where the cluster allows it
    retries: int = 2
    spare_nodes: int = 0
    health_check: Optional[str] = None
    signal_seconds: int = 120
    stop_grace: int = 90
    hang_timeout: str = "15"
    flight_recorder: bool = True
    peer_heal: bool = True  # issue 55: a lost node's job resumes from the survivors' memory (runtime/peerheal.py)
    warm_start: bool = False  # issue 55: ranks forked from a per-node server that imported torch (runtime/warm.py)
    sweep: Optional["JobArray"] = None  # a sweep's trials, one per array task (sweeps/grid.py's job_array)

    def __post_init__(self) -> None:
        # Normalise sequences (lists from callers) into tuples so the spec stays hashable and frozen.
        for name in ("args", "setup", "sbatch_args", "after", "exclude"):
            object.__setattr__(self, name, tuple(str(x) for x in getattr(self, name)))
        env = self.env
        if isinstance(env, Mapping):
            env = tuple(env.items())
        object.__setattr__(self, "env", tuple((str(k), str(v)) for k, v in env))
        # A relative path that starts with '-' would be read as an option by sbatch, torchrun or python.
        if not self.module:
            object.__setattr__(self, "script", path_word(self.script))
        object.__setattr__(self, "output_dir", path_word(str(self.output_dir)))
        if self.job_name is None:
            object.__setattr__(self, "job_name", self.default_job_name())
        self._validate()

    # --- derived values -------------------------------------------------------------------------------
    @property
    def tasks_per_node(self) -> int:
        """Ranks (processes) per node: one per GPU, or ``procs_per_node`` for a CPU job."""
        return self.gpus_per_node if self.gpus_per_node > 0 else (self.procs_per_node or 1)

    @property
    def world_size(self) -> int:
        return self.nodes * self.tasks_per_node

    @property
    def alloc_nodes(self) -> int:
        """Nodes asked of Slurm: the job's own and its spares (each attempt runs on ``nodes`` healthy ones)."""
        return self.nodes + self.spare_nodes

    @property
    def dist_backend(self) -> str:
        """torch.distributed's backend: nccl with GPUs, gloo without (a "backend" elsewhere is the scheduler)."""
        return "nccl" if self.gpus_per_node > 0 else "gloo"

    @property
    def time_seconds(self) -> Optional[int]:
        return None if self.time is None else parse_time(self.time)

    @property
    def hang_timeout_seconds(self) -> int:
        """Seconds without progress on any rank before the runtime's watchdog ends the job (0: off)."""
        return 0 if self.hang_timeout in ("0", "off") else parse_time(self.hang_timeout)

    @property
    def promised_env(self) -> List[Tuple[str, str]]:
        """What every rank is told about the job's shape, whatever the backend (contract.py's names)."""
        return [(contract.LAUNCHER, str(self.launcher)), (contract.NNODES, str(self.nodes)),
                (contract.GPUS_PER_NODE, str(self.gpus_per_node)), (contract.PROCS_PER_NODE, str(self.tasks_per_node)),
                (contract.WORLD_SIZE, str(self.world_size)), (contract.HANG_TIMEOUT, str(self.hang_timeout_seconds))] \
            + ([] if self.peer_heal else [(contract.PEER_HEAL, "0")])

    @property
    def requeues(self) -> bool:
        """Checkpoint-and-requeue on the time-limit warning: asked for, or by default whenever there is a limit."""
        if self.requeue is not None:
            return self.requeue
        return bool(self.time_seconds)

    @property
    def slurm_tasks_per_node(self) -> int:
        """Slurm tasks per node: one per rank for srun, one per node for torchrun and spawn."""
        return contract.LAUNCHERS[self.launcher].slurm_tasks_per_node(self.tasks_per_node)

    @property
    def slurm_cpus_per_task(self) -> Optional[int]:
        if self.cpus_per_task is None:
            return None
        return self.cpus_per_task * (self.tasks_per_node // self.slurm_tasks_per_node)

    @property
    def file_stem(self) -> str:
        return slug(self.job_name or "job")

    def default_job_name(self) -> str:
        if not self.script:
            return "clusterddp"
        base = self.script.rsplit(".", 1)[-1] if self.module else self.script.rsplit("/", 1)[-1]
        if base.endswith(".py"):
            base = base[:-3]
        return slug(base)

    def program_argv(self) -> List[str]:
        """What each rank runs after the interpreter or launcher: ``train.py ARGS`` or ``-m pkg.mod ARGS``."""
        self.require_entry_point()
        return (["-m", self.script] if self.module else [self.script]) + list(self.args)

    def require_entry_point(self) -> None:
        """A script job needs a script (the Python API's function jobs do not)."""
        if not self.script:
            raise SpecError("no entry point given: pass a script path (train.py) or -m package.module")

    def replace(self, **changes: object) -> "JobSpec":
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    def sbatch_directives(self) -> List[Tuple[str, Optional[str]]]:
        """The ordered ``#SBATCH`` options as (name, value or None for a flag); backends/slurm/script.py encodes
        them."""
        # --ignore-pbs first: sbatch would otherwise turn #PBS/#BSUB lines near the top into options.
        d: List[Tuple[str, Optional[str]]] = [("ignore-pbs", None), ("job-name", self.job_name),
                                               ("nodes", str(self.alloc_nodes)),
                                               ("ntasks-per-node", str(self.slurm_tasks_per_node))]
        if self.gpus_per_node:
            if self.gpu_request == "gres":
                d.append(("gres", f"gpu:{self.gpus_per_node}"))
            elif self.gpu_request == "gpus-per-task":
                d.append(("gpus-per-task", "1"))
            else:
                d.append(("gpus-per-node", str(self.gpus_per_node)))
        if self.slurm_cpus_per_task is not None:
            d.append(("cpus-per-task", str(self.slurm_cpus_per_task)))
        for name in ("mem", "time", "partition", "account", "qos", "constraint", "array"):
            value = getattr(self, name)
            if value is not None:
                d.append((name, value))
        if self.exclude:
            d.append(("exclude", ",".join(self.exclude)))
        if self.after:
            d.append(("dependency", "afterok:" + ":".join(self.after)))
        if self.exclusive:
            d.append(("exclusive", None))
        if self.requeues:
            # B: signals only the batch shell, which asks the ranks to stop (USR1 is swallowed by NCCL in known
            # versions; without B: the torchrun agent dies of it). A requeued job appends to its logs.
            d += [("signal", f"B:USR2@{self.signal_seconds}"), ("requeue", "expedite" if self.expedite else None),
                  ("open-mode", "append")]
        # Not %x: the job name is user text and a '/' in it would make paths; the stem is sanitised. A '%'
        # in the directory would be read as a pattern by sbatch, so it is doubled.
        log = contract.batch_log(self.file_stem.replace("%", "%%"), "%j")
        d.append(("output", f"{self.output_dir.replace('%', '%%')}/{log}"))
        d += [sbatch_options.resolve(arg) for arg in self.sbatch_args]
        return d

    def _validate(self) -> None:
        validate.check(self)


def field_default(name: str) -> object:
    """The built-in default of a JobSpec field (the CLI's defaults come from here)."""
    return {f.name: f.default for f in dataclasses.fields(JobSpec)}[name]


def field_names() -> List[str]:
    return [f.name for f in dataclasses.fields(JobSpec)]


__all__: Sequence[str] = ["JobSpec", "LAUNCHERS", "GPU_REQUESTS", "parse_time", "parse_env", "sbatch_quote", "slug",
                          "field_names"]
