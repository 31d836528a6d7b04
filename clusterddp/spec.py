"""The job: one frozen, validated :class:`JobSpec`, the contract between the CLI, the templates, the local
backend and the Python API. Everything derived (world size, the #SBATCH directives) is computed here once.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Iterable, List, Mapping, Optional, Sequence, Tuple

from . import contract, sbatch_options
from .errors import SpecError
from .parse import MAX_COUNT, SBATCH_VALUE_MAX, parse_env, parse_time, slug, suggest
from .quoting import check_command_word, check_no_control, check_one_line, check_utf8, path_word, sbatch_quote, shown

LAUNCHERS = tuple(contract.LAUNCHERS)
GPU_REQUESTS = ("gpus-per-node", "gres", "gpus-per-task")
# Patterns are used with fullmatch: Python's '$' also matches before a trailing newline.
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
_MEM = re.compile(r"[0-9]+[KMGT]?")
_NODES = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(\[[0-9,-]+\][A-Za-z0-9._-]*)*")  # a node name or a host list
MAX_RETRIES = 20  # in-job retries after node faults
_SBATCH_OPT = re.compile(r"--[A-Za-z][A-Za-z0-9-]*")
_ARRAY = re.compile(r"[0-9]+(-[0-9]+)?(:[0-9]+)?(,[0-9]+(-[0-9]+)?(:[0-9]+)?)*(%[0-9]+)?")


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
    retries: int = 2
    spare_nodes: int = 0
    health_check: Optional[str] = None
    signal_seconds: int = 120
    stop_grace: int = 90
    hang_timeout: str = "15"
    flight_recorder: bool = True
    sweep: Optional[object] = None  # a sweep.SweepJob: the trials, one per array task (set by sweep_run.py)

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
    def backend(self) -> str:
        return "nccl" if self.gpus_per_node > 0 else "gloo"

    @property
    def time_seconds(self) -> Optional[int]:
        return None if self.time is None else parse_time(self.time)

    @property
    def hang_timeout_seconds(self) -> int:
        """Seconds without progress on any rank before the runtime's watchdog ends the job (0: off)."""
        return 0 if self.hang_timeout in ("0", "off") else parse_time(self.hang_timeout)

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
        """The ordered ``#SBATCH`` options as (name, value or None for a flag); render.py encodes them."""
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
            d += [("signal", f"B:USR2@{self.signal_seconds}"), ("requeue", None), ("open-mode", "append")]
        # Not %x: the job name is user text and a '/' in it would make paths; the stem is sanitised. A '%'
        # in the directory would be read as a pattern by sbatch, so it is doubled.
        log = contract.batch_log(self.file_stem.replace("%", "%%"), "%j")
        d.append(("output", f"{self.output_dir.replace('%', '%%')}/{log}"))
        d += [sbatch_options.resolve(arg) for arg in self.sbatch_args]
        return d

    # --- validation -----------------------------------------------------------------------------------
    def _texts(self) -> Iterable[Tuple[str, str]]:
        """Every text the user gave, with its field name."""
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, str):
                yield f.name, value
            elif f.name == "env":
                for k, v in value:
                    yield f"env {shown(k)}", k
                    yield f"env {k}", v
            elif isinstance(value, tuple):
                for item in value:
                    yield f.name, item

    def _validate(self) -> None:
        for name, value in self._texts():
            check_utf8(value, name)
        def positive_int(name: str, value: object, minimum: int) -> None:
            if isinstance(value, bool) or not isinstance(value, int):
                raise SpecError(f"{name} must be an integer, got {value!r}")
            if value < minimum:
                raise SpecError(f"{name} must be at least {minimum}, got {value}")
            if value > MAX_COUNT:
                raise SpecError(f"{name} must be at most {MAX_COUNT} (what Slurm accepts), got {value}")

        positive_int("nodes", self.nodes, 1)
        positive_int("gpus_per_node", self.gpus_per_node, 0)
        if self.procs_per_node is not None:
            positive_int("procs_per_node", self.procs_per_node, 1)
            if self.gpus_per_node and self.procs_per_node != self.gpus_per_node:
                raise SpecError(
                    f"conflicting options: gpus_per_node={self.gpus_per_node} runs one process per GPU, but "
                    f"procs_per_node={self.procs_per_node}; drop --procs-per-node or use --gpus 0 for a CPU job")
        if self.cpus_per_task is not None:
            positive_int("cpus_per_task", self.cpus_per_task, 1)
        for name in ("max_requeues", "retries", "spare_nodes"):
            positive_int(name, getattr(self, name), 0)
        if self.retries > MAX_RETRIES:
            raise SpecError(f"retries must be at most {MAX_RETRIES} (each follows a node fault: more is a broken "
                            f"program or cluster, not bad luck), got {self.retries}")
        if self.spare_nodes and not self.retries:  # a spare replaces a node at fault in a retry
            raise SpecError(f"spare_nodes={self.spare_nodes} with retries=0: give --retries 1 or more, or no spares")
        positive_int("nodes + spare_nodes", self.alloc_nodes, 1)
        positive_int("signal_seconds", self.signal_seconds, 10)
        positive_int("stop_grace", self.stop_grace, 1)
        try:
            self.hang_timeout_seconds  # noqa: B018 (validates)
        except SpecError as exc:
            raise SpecError(f"hang_timeout: {exc} (0 turns the hang watchdog off)") from None
        if self.requeues and self.stop_grace >= self.signal_seconds:
            raise SpecError(f"stop_grace={self.stop_grace} s is not below signal_seconds={self.signal_seconds} s: "
                            "Slurm would kill the job at its time limit before it could requeue; lower --stop-grace "
                            "or raise --signal-before")
        if self.requeues and self.time_seconds and self.signal_seconds >= self.time_seconds:
            raise SpecError(f"signal_seconds={self.signal_seconds} is not below the time limit {self.time!r} "
                            f"({self.time_seconds} s): the warning would come before the job starts; lower "
                            "--signal-before or raise --time")
        if self.master_port is not None:
            positive_int("master_port", self.master_port, 1)
            if self.master_port > 65535:
                raise SpecError(f"master_port must be at most 65535, got {self.master_port}")
        if self.launcher not in LAUNCHERS:
            raise SpecError(f"unknown launcher {self.launcher!r}{suggest(self.launcher, LAUNCHERS)}: "
                            f"expected one of {', '.join(LAUNCHERS)}")
        if self.gpu_request not in GPU_REQUESTS:
            raise SpecError(f"unknown gpu_request {self.gpu_request!r}{suggest(self.gpu_request, GPU_REQUESTS)}: "
                            f"expected one of {', '.join(GPU_REQUESTS)}")
        if self.gpu_request == "gpus-per-task" and not contract.LAUNCHERS[self.launcher].task_per_rank:
            raise SpecError("gpu_request 'gpus-per-task' needs one Slurm task per GPU: use it with --launcher srun "
                            "(torchrun and spawn run one task per node)")
        if self.module and not _MODULE.fullmatch(self.script):
            raise SpecError(f"invalid module name {shown(self.script)}: expected dotted Python identifiers "
                            "(e.g. -m mypkg.train)")
        for node in self.exclude:
            if not _NODES.fullmatch(node):
                raise SpecError(f"invalid node to exclude {shown(node)}: expected node names or Slurm host lists "
                                "(node7, gpu[01-04]), separated by commas")
        if self.time is not None:
            parse_time(self.time)
        if self.mem is not None and not _MEM.fullmatch(self.mem):
            raise SpecError(f"invalid memory {shown(self.mem)}: expected a number with an optional unit K, M, G or "
                            "T (e.g. 64G; Slurm's default unit is M)")
        # Values that end up on #SBATCH lines and in paths: names, not free text.
        for name in ("job_name", "partition", "account", "qos", "constraint", "output_dir", "template",
                     "container_image"):
            value = getattr(self, name)
            if value is not None:
                check_no_control(value, name)
                if not value.strip():
                    raise SpecError(f"{name} must not be empty")
        if not self.module:
            check_no_control(self.script, "script path")
        if "\\" in self.output_dir:
            raise SpecError(f"output_dir {shown(self.output_dir)} contains a backslash, which turns off sbatch's "
                            "%j file-name patterns; choose a path without '\\'")
        # Words bash or a launcher runs as a command.
        check_command_word(self.python, "python", "--python")
        if self.apptainer is not None:
            check_command_word(self.apptainer, "apptainer image", "--apptainer")
        for arg in self.args:
            if "\0" in arg:
                raise SpecError(f"script argument {shown(arg)} contains a NUL byte, which no program can receive")
        for name, value in self.env:
            if not _ENV_NAME.fullmatch(name):
                raise SpecError(f"invalid environment variable name {shown(name)} in --env: expected letters, "
                                "digits and '_', not starting with a digit (e.g. NCCL_DEBUG=INFO)")
            if contract.reserved_env_name(name):
                raise SpecError(f"--env {name}=... is refused: the batch script, srun, torchrun or bash read {name} "
                                "(SLURM_*, SBATCH_*, SRUN_*, CLUSTERDDP_*, PET_*, TORCHELASTIC_*, MASTER_ADDR/PORT, "
                                "the RANK family, bash's own variables); clusterddp sets what the job needs")
            if "\0" in value:
                raise SpecError(f"environment value of {name} contains a NUL byte, which no program can receive")
        for line in self.setup + ((self.health_check,) if self.health_check is not None else ()):
            check_one_line(line, "setup line" if line in self.setup else "health_check")
        for arg in self.sbatch_args:
            if not _SBATCH_OPT.fullmatch(arg.split("=", 1)[0]):
                raise SpecError(f"invalid --sbatch-arg {shown(arg)}: expected a long option as --name or "
                                "--name=value (e.g. --sbatch-arg=--mail-type=END)")
            check_no_control(arg, "--sbatch-arg")
            sbatch_options.resolve(arg)
        if self.container_image is not None and self.apptainer is not None:
            raise SpecError("conflicting options: --container-image (pyxis/enroot) and --apptainer both given; "
                            "choose one container runtime")
        for name, path in (("output_dir", self.output_dir), ("script path", "" if self.module else self.script)):
            for part in path.split("/"):
                if len(part.encode()) > 255:
                    raise SpecError(f"{name} {shown(path)} has a path component of {len(part.encode())} bytes; "
                                    "file systems allow at most 255")
        for option, directive in self.sbatch_directives():
            if directive is not None and len(directive.encode()) > SBATCH_VALUE_MAX:
                raise SpecError(f"#SBATCH --{option} {shown(directive)} is {len(directive.encode())} bytes long; "
                                f"Slurm refuses values over {SBATCH_VALUE_MAX} bytes: shorten it")
        if self.array is not None and not _ARRAY.fullmatch(self.array):
            raise SpecError(f"invalid --array {self.array!r}: expected sbatch's form, e.g. 0-9, 1,3,5, 0-15:4 or "
                            "0-99%10 (at most 10 at once)")
        for job in self.after:
            if not re.fullmatch(r"[0-9]+(_[0-9]+)?", job):
                raise SpecError(f"invalid --after {job!r}: expected a job id such as 1234 (or 1234_5)")


def field_default(name: str) -> object:
    """The built-in default of a JobSpec field (the CLI's defaults come from here)."""
    return {f.name: f.default for f in dataclasses.fields(JobSpec)}[name]


def field_names() -> List[str]:
    return [f.name for f in dataclasses.fields(JobSpec)]


__all__: Sequence[str] = ["JobSpec", "LAUNCHERS", "GPU_REQUESTS", "parse_time", "parse_env", "sbatch_quote", "slug",
                          "field_names"]
