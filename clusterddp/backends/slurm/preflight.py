"""Pre-flight checks on ``submit``: catch what would fail hours later, before the job waits in the queue."""
from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Optional

from ...errors import PreflightError
from ...job.spec import JobSpec

if TYPE_CHECKING:
    from .commands import Partition


def _mem_mb(mem: str) -> int:
    m = re.fullmatch(r"(\d+)([KMGT]?)", mem)
    value, unit = int(m.group(1)), m.group(2) or "M"  # type: ignore[union-attr]
    return math.ceil(value * {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}[unit])


def script_not_found(script: str) -> PreflightError:
    """The one wording of a training script that is not there (the CLI, the pre-flight check and the API)."""
    hint = " (a directory: give the script inside it)" if Path(script).is_dir() else ""
    return PreflightError(f"training script {script!r} not found{hint}: give a path relative to the directory you "
                          "submit from, or a module (-m package.module)")


def check_local(spec: JobSpec, here: bool = True) -> None:
    """On this machine: the entry point exists and the output directory can be written. For a remote cluster
    (``here`` False) the script must lie in the directory submitted from, which is what is copied there."""
    if not spec.module and not Path(spec.script).is_file():
        raise script_not_found(spec.script)
    if not here:
        if not spec.module and (Path(spec.script).is_absolute() or ".." in Path(spec.script).parts):
            raise PreflightError(f"training script {spec.script!r} is not a path inside the directory you submit "
                                 "from, which is what is copied to the cluster: submit from a directory that holds "
                                 "it and give its relative path")
        return
    out = Path(spec.output_dir)
    probe = out if out.exists() else next((p for p in out.parents if p.exists()), Path("."))
    if not probe.is_dir() or not os.access(probe, os.W_OK | os.X_OK):
        raise PreflightError(f"output directory {spec.output_dir!r} is not writable here ({probe} is not): choose "
                             "another --output-dir")


def check_cluster(spec: JobSpec, partitions: Dict[str, Partition]) -> List[str]:
    """Against what the cluster offers. Raises PreflightError naming the offer and the fix; returns notes."""
    if not partitions:
        return ["sinfo lists no partitions: skipped the cluster checks"]
    if spec.partition is None:
        default: Optional[str] = next((p.name for p in partitions.values() if p.default), None)
        if default is None:
            return ["no default partition: skipped the cluster checks (give --partition)"]
        names = [default]
    else:
        names = spec.partition.split(",")  # sbatch takes a list and runs the job in the first that can
    for name in names:
        if name not in partitions:
            raise PreflightError(f"partition {name!r} does not exist; partitions here: "
                                 f"{', '.join(sorted(partitions))}")
    first_error: Optional[PreflightError] = None
    for name in names:
        try:
            _check_partition(spec, partitions[name])
            return []
        except PreflightError as exc:
            first_error = first_error or exc
    assert first_error is not None
    raise first_error


def _check_partition(spec: JobSpec, p: Partition) -> None:
    """The job against one partition's offer; PreflightError naming the offer and the fix."""
    name = p.name
    if spec.spare_nodes and spec.alloc_nodes > p.nodes:
        raise PreflightError(f"partition {name} has {p.nodes} node(s); you asked for {spec.nodes} and "
                             f"{spec.spare_nodes} spare(s), {spec.alloc_nodes} in all: use at most --spare-nodes "
                             f"{max(0, p.nodes - spec.nodes)}" + (f" with --nodes {spec.nodes}" if spec.nodes <= p.nodes
                                                                  else ""))
    if spec.nodes > p.nodes:
        per = spec.tasks_per_node
        raise PreflightError(f"partition {name} has {p.nodes} node(s); you asked for {spec.nodes}: use at most "
                             f"--nodes {p.nodes}" + (f" (world size {p.nodes * per})" if per else ""))
    if spec.exclude and p.names:
        from ...hostlist import expand

        excluded = {n for entry in spec.exclude for n in expand(entry)}
        left = [n for n in p.names if n not in excluded]
        if spec.alloc_nodes > len(left):
            out = sorted(excluded & set(p.names))
            raise PreflightError(f"partition {name} has {p.nodes} node(s) and {len(out)} of them are left out "
                                 f"({','.join(out)}: --exclude or quarantined after a fault), so {len(left)} "
                                 f"remain; you asked for {spec.alloc_nodes}: use fewer --nodes, or the left-out nodes "
                                 "anyway (clusterddp nodes --forget NODE, or submit --no-quarantine)")
    if spec.gpus_per_node > p.gpus_per_node:
        if p.gpus_per_node == 0:
            raise PreflightError(f"partition {name} has no GPUs; you asked for {spec.gpus_per_node} per node: choose "
                                 "a GPU partition (--partition) or run on CPU (--gpus 0 --procs-per-node N)")
        nodes = math.ceil(spec.world_size / p.gpus_per_node)
        if nodes <= p.nodes:
            fix = f"use --nodes {nodes} --gpus {p.gpus_per_node} for world size {nodes * p.gpus_per_node}"
        else:
            fix = (f"the most it offers is --nodes {p.nodes} --gpus {p.gpus_per_node} (world size "
                   f"{p.nodes * p.gpus_per_node}) for your world size {spec.world_size}")
        raise PreflightError(f"partition {name} has {p.gpus_per_node} GPUs per node; you asked for "
                             f"{spec.gpus_per_node}: {fix}")
    cpus = spec.slurm_tasks_per_node * (spec.slurm_cpus_per_task or 1)
    if cpus > p.cpus_per_node:
        most = max(1, p.cpus_per_node // spec.tasks_per_node)
        raise PreflightError(f"partition {name} has {p.cpus_per_node} CPUs per node; {spec.tasks_per_node} rank(s) x "
                             f"{spec.cpus_per_task or 1} CPUs need {cpus}: use --cpus-per-task {most} or fewer")
    if spec.mem is not None and _mem_mb(spec.mem) > p.mem_mb_per_node > 0:
        raise PreflightError(f"partition {name} has {p.mem_mb_per_node} MB of memory per node; you asked for "
                             f"--mem {spec.mem}: ask for at most {p.mem_mb_per_node}M (or --mem 0 for all of it)")
    seconds = spec.time_seconds
    if p.max_time_s is not None and (not seconds or seconds > p.max_time_s):
        raise PreflightError(f"partition {name} allows at most {_hms(p.max_time_s)}; you asked for "
                             f"{spec.time or 'UNLIMITED'}: lower --time (requeue continues longer runs)")


def _hms(seconds: int) -> str:
    d, rest = divmod(seconds, 86400)
    return (f"{d}-" if d else "") + f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
