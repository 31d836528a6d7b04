"""A JobSpec's validation, at construction (spec.py calls ``check``): counts, choices, the texts that reach a
batch script, and what Slurm itself would refuse. Each error says what was given, what is expected, how to fix it.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Iterable, Tuple

from .. import contract
from ..errors import SpecError
from . import sbatch_options
from .ids import is_job_id
from .parse import MAX_COUNT, SBATCH_VALUE_MAX, parse_time, suggest
from .quoting import check_command_word, check_no_control, check_one_line, check_utf8, shown

# The spec is typed Any here: spec.py imports this module, and a type-only import back would make the two one.
JobSpec = Any

LAUNCHERS = tuple(contract.LAUNCHERS)
GPU_REQUESTS = ("gpus-per-node", "gres", "gpus-per-task")
MAX_RETRIES = 20  # in-job retries after node faults
# Patterns are used with fullmatch: Python's '$' also matches before a trailing newline.
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
_MEM = re.compile(r"[0-9]+[KMGT]?")
_NODES = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(\[[0-9,-]+\][A-Za-z0-9._-]*)*")  # a node name or a host list
_SBATCH_OPT = re.compile(r"--[A-Za-z][A-Za-z0-9-]*")
_ARRAY = re.compile(r"[0-9]+(-[0-9]+)?(:[0-9]+)?(,[0-9]+(-[0-9]+)?(:[0-9]+)?)*(%[0-9]+)?")


def check(spec: JobSpec) -> None:
    for name, value in texts(spec):
        check_utf8(value, name)
    _counts(spec)
    _time_and_signals(spec)
    _choices(spec)
    _names(spec)
    _commands_and_environment(spec)
    _slurm_limits(spec)


def texts(spec: JobSpec) -> Iterable[Tuple[str, str]]:
    """Every text the user gave, with its field name."""
    for f in dataclasses.fields(spec):
        value = getattr(spec, f.name)
        if isinstance(value, str):
            yield f.name, value
        elif f.name == "env":
            for k, v in value:
                yield f"env {shown(k)}", k
                yield f"env {k}", v
        elif isinstance(value, tuple):
            for item in value:
                yield f.name, item


def positive_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise SpecError(f"{name} must be at least {minimum}, got {value}")
    if value > MAX_COUNT:
        raise SpecError(f"{name} must be at most {MAX_COUNT} (what Slurm accepts), got {value}")


def _counts(spec: JobSpec) -> None:
    positive_int("nodes", spec.nodes, 1)
    positive_int("gpus_per_node", spec.gpus_per_node, 0)
    if spec.procs_per_node is not None:
        positive_int("procs_per_node", spec.procs_per_node, 1)
        if spec.gpus_per_node and spec.procs_per_node != spec.gpus_per_node:
            raise SpecError(
                f"conflicting options: gpus_per_node={spec.gpus_per_node} runs one process per GPU, but "
                f"procs_per_node={spec.procs_per_node}; drop --procs-per-node or use --gpus 0 for a CPU job")
    if spec.cpus_per_task is not None:
        positive_int("cpus_per_task", spec.cpus_per_task, 1)
    for name in ("max_requeues", "retries", "spare_nodes"):
        positive_int(name, getattr(spec, name), 0)
    if spec.retries > MAX_RETRIES:
        raise SpecError(f"retries must be at most {MAX_RETRIES} (each follows a node fault: more is a broken "
                        f"program or cluster, not bad luck), got {spec.retries}")
    if spec.spare_nodes and not spec.retries:  # a spare replaces a node at fault in a retry
        raise SpecError(f"spare_nodes={spec.spare_nodes} with retries=0: give --retries 1 or more, or no spares")
    positive_int("nodes + spare_nodes", spec.alloc_nodes, 1)
    if spec.master_port is not None:
        positive_int("master_port", spec.master_port, 1)
        if spec.master_port > 65535:
            raise SpecError(f"master_port must be at most 65535, got {spec.master_port}")


def _time_and_signals(spec: JobSpec) -> None:
    positive_int("signal_seconds", spec.signal_seconds, 10)
    positive_int("stop_grace", spec.stop_grace, 1)
    try:
        spec.hang_timeout_seconds  # noqa: B018 (validates)
    except SpecError as exc:
        raise SpecError(f"hang_timeout: {exc} (0 turns the hang watchdog off)") from None
    if spec.time is not None:
        parse_time(spec.time)
    if spec.expedite and not spec.requeues:
        raise SpecError("expedite (an expedited requeue) needs the job to requeue: give --time (requeue is on with a "
                        "time limit) or --requeue")
    if spec.requeues and spec.stop_grace >= spec.signal_seconds:
        raise SpecError(f"stop_grace={spec.stop_grace} s is not below signal_seconds={spec.signal_seconds} s: "
                        "Slurm would kill the job at its time limit before it could requeue; lower --stop-grace "
                        "or raise --signal-before")
    if spec.requeues and spec.time_seconds and spec.signal_seconds >= spec.time_seconds:
        raise SpecError(f"signal_seconds={spec.signal_seconds} is not below the time limit {spec.time!r} "
                        f"({spec.time_seconds} s): the warning would come before the job starts; lower "
                        "--signal-before or raise --time")


def _choices(spec: JobSpec) -> None:
    if spec.launcher not in LAUNCHERS:
        raise SpecError(f"unknown launcher {spec.launcher!r}{suggest(spec.launcher, LAUNCHERS)}: "
                        f"expected one of {', '.join(LAUNCHERS)}")
    if spec.gpu_request not in GPU_REQUESTS:
        raise SpecError(f"unknown gpu_request {spec.gpu_request!r}{suggest(spec.gpu_request, GPU_REQUESTS)}: "
                        f"expected one of {', '.join(GPU_REQUESTS)}")
    if spec.gpu_request == "gpus-per-task" and not contract.LAUNCHERS[spec.launcher].task_per_rank:
        raise SpecError("gpu_request 'gpus-per-task' needs one Slurm task per GPU: use it with --launcher srun "
                        "(torchrun and spawn run one task per node)")
    if spec.container_image is not None and spec.apptainer is not None:
        raise SpecError("conflicting options: --container-image (pyxis/enroot) and --apptainer both given; "
                        "choose one container runtime")
    if spec.warm_start and spec.gpu_request == "gpus-per-task":
        raise SpecError("--warm-start with --gpu-request gpus-per-task: each node's server step would hold one task's "
                        "GPU, not the node's; use --gpu-request gpus-per-node (or gres) with --warm-start")
    if spec.warm_start and (spec.launcher == "spawn" or spec.container_image or spec.apptainer):
        raise SpecError(f"--warm-start needs --launcher srun or torchrun without a container (given: --launcher "
                        f"{spec.launcher}" + (", a container" if spec.container_image or spec.apptainer else "")
                        + "): its server forks each rank's process, which mp.spawn starts itself and a container's "
                        "runtime must start inside the image; use --launcher srun or torchrun without a container, "
                        "or leave --warm-start out")


def _names(spec: JobSpec) -> None:
    """Values that end up on #SBATCH lines and in paths: names, not free text."""
    if spec.module and not _MODULE.fullmatch(spec.script):
        raise SpecError(f"invalid module name {shown(spec.script)}: expected dotted Python identifiers "
                        "(e.g. -m mypkg.train)")
    for node in spec.exclude:
        if not _NODES.fullmatch(node):
            raise SpecError(f"invalid node to exclude {shown(node)}: expected node names or Slurm host lists "
                            "(node7, gpu[01-04]), separated by commas")
    if spec.mem is not None and not _MEM.fullmatch(spec.mem):
        raise SpecError(f"invalid memory {shown(spec.mem)}: expected a number with an optional unit K, M, G or "
                        "T (e.g. 64G; Slurm's default unit is M)")
    for name in ("job_name", "partition", "account", "qos", "constraint", "output_dir", "template",
                 "container_image"):
        value = getattr(spec, name)
        if value is not None:
            check_no_control(value, name)
            if not value.strip():
                raise SpecError(f"{name} must not be empty")
    if not spec.module:
        check_no_control(spec.script, "script path")
    if "\\" in spec.output_dir:
        raise SpecError(f"output_dir {shown(spec.output_dir)} contains a backslash, which turns off sbatch's "
                        "%j file-name patterns; choose a path without '\\'")
    for name, path in (("output_dir", spec.output_dir), ("script path", "" if spec.module else spec.script)):
        for part in path.split("/"):
            if len(part.encode()) > 255:
                raise SpecError(f"{name} {shown(path)} has a path component of {len(part.encode())} bytes; "
                                "file systems allow at most 255")


def _commands_and_environment(spec: JobSpec) -> None:
    """Words bash or a launcher runs as a command, the program's arguments and its environment."""
    check_command_word(spec.python, "python", "--python")
    if spec.apptainer is not None:
        check_command_word(spec.apptainer, "apptainer image", "--apptainer")
    for arg in spec.args:
        if "\0" in arg:
            raise SpecError(f"script argument {shown(arg)} contains a NUL byte, which no program can receive")
    for name, value in spec.env:
        if not _ENV_NAME.fullmatch(name):
            raise SpecError(f"invalid environment variable name {shown(name)} in --env: expected letters, "
                            "digits and '_', not starting with a digit (e.g. NCCL_DEBUG=INFO)")
        if contract.reserved_env_name(name):
            raise SpecError(f"--env {name}=... is refused: the batch script, srun, torchrun or bash read {name} "
                            "(SLURM_*, SBATCH_*, SRUN_*, CLUSTERDDP_*, PET_*, TORCHELASTIC_*, MASTER_ADDR/PORT, "
                            "the RANK family, bash's own variables); clusterddp sets what the job needs")
        if "\0" in value:
            raise SpecError(f"environment value of {name} contains a NUL byte, which no program can receive")
    for line in spec.setup + ((spec.health_check,) if spec.health_check is not None else ()):
        check_one_line(line, "setup line" if line in spec.setup else "health_check")


def _slurm_limits(spec: JobSpec) -> None:
    """What sbatch itself would refuse, said before it does."""
    for arg in spec.sbatch_args:
        if not _SBATCH_OPT.fullmatch(arg.split("=", 1)[0]):
            raise SpecError(f"invalid --sbatch-arg {shown(arg)}: expected a long option as --name or "
                            "--name=value (e.g. --sbatch-arg=--mail-type=END)")
        check_no_control(arg, "--sbatch-arg")
        sbatch_options.resolve(arg)
    for option, directive in spec.sbatch_directives():
        if directive is not None and len(directive.encode()) > SBATCH_VALUE_MAX:
            raise SpecError(f"#SBATCH --{option} {shown(directive)} is {len(directive.encode())} bytes long; "
                            f"Slurm refuses values over {SBATCH_VALUE_MAX} bytes: shorten it")
    if spec.array is not None and not _ARRAY.fullmatch(spec.array):
        raise SpecError(f"invalid --array {spec.array!r}: expected sbatch's form, e.g. 0-9, 1,3,5, 0-15:4 or "
                        "0-99%10 (at most 10 at once)")
    for job in spec.after:
        if not is_job_id(job):
            raise SpecError(f"invalid --after {job!r}: expected a job id such as 1234 (or 1234_5)")
