"""A submission, start to end: spec -> pre-flight -> script -> the host places it -> sbatch -> record.

The middle layer between the CLI (and the Python API's callers) and Slurm: the same flow for this machine and a
cluster over SSH, whose differences live in the host (hosts.py, ssh/)."""
from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Callable, Sequence

from ... import contract
from ...errors import ClusterDDPError, PreflightError, SlurmError
from ...job import sbatch_options
from ..record import JobRecord
from .preflight import check_cluster, check_local
from .script import render

if TYPE_CHECKING:
    from ...job.spec import JobSpec
    from ..hosts import Host
    from .commands import Slurm


def submit(spec: "JobSpec", host: "Host", slurm: "Slurm", template_dirs: Sequence[str] = (), check: bool = True,
           note: Callable[[str], None] = lambda line: None) -> JobRecord:
    """Submit ``spec`` through ``host`` (this machine or a login node) to its ``slurm``: pre-flight checks
    (local, then the partition offer from sinfo; skipped with ``check=False``), the script written under the output
    directory, ``sbatch --test-only``, ``sbatch``, the record.

    On a remote cluster the directory submitted from is first copied there (only what changed) and the job runs
    from its own snapshot of that copy. The script keeps the name sbatch saw (``scontrol show job`` reports it as
    the Command); when submission fails, the error says where the script was kept.
    """
    spec = host.job_spec(spec)
    text = render(spec, template_dirs=template_dirs)
    if check:
        check_local(spec, here=not host.remote)
    host.check_copy(spec)
    if spec.requeues and spec.expedite is not False:
        spec = _expedite(spec, slurm)
        text = render(spec, template_dirs=template_dirs)
    if check:
        for line in check_cluster(spec, slurm.partitions()):
            note(line)
    name = f"{spec.file_stem}-{time.strftime('%Y%m%d-%H%M%S')}-{os.urandom(3).hex()}.sbatch"
    place = host.place(spec, check, note)
    out = place.output_dir
    if place.cwd is not None and out != spec.output_dir:  # it runs elsewhere: its outputs by their absolute path
        text = render(spec.replace(output_dir=out), template_dirs=template_dirs)
    script = f"{out}/{name}"
    host.write(script, text)
    try:
        if check:
            try:
                slurm.test_only(script, place.cwd)
            except SlurmError as exc:
                raise PreflightError(f"sbatch --test-only refused the job: {exc.stderr.strip() or exc}; "
                                     "(--no-check skips the checks)") from None
        # Held until the files of an earlier job with the same id (a reset counter, a second cluster sharing the
        # directory) are moved aside, so the new job's log and run directory never mix with them. Only after the
        # --test-only check: a held job skips sbatch's own "can never run" refusal. With --no-check the files are
        # moved right after sbatch (a job that starts within milliseconds could open them first).
        job_id = slurm.sbatch(script, hold=check, cwd=place.cwd)
    except ClusterDDPError as exc:
        raise type(exc)(f"{exc}\n  the script is kept at {host.shown(script)}") from None
    paths = [f"{out}/{contract.batch_log(spec.file_stem, job_id)}", f"{out}/{contract.run_dir(spec.file_stem, job_id)}"]
    _clear_the_way(job_id, paths, host, slurm, note)
    record = JobRecord(job_id=job_id, script_path=script, batch_log=paths[0], run_dir=paths[1],
                       launcher=spec.launcher, procs_per_node=spec.tasks_per_node, nodes=spec.nodes,
                       cluster=host.cluster.name, python=spec.python)
    record.save()
    held_on_purpose = any(sbatch_options.resolve(arg)[0] == "hold" for arg in spec.sbatch_args)
    if check and not held_on_purpose:
        try:
            slurm.release(job_id)
        except SlurmError as exc:
            raise SlurmError(f"job {job_id} was submitted held and could not be released: run "
                             f"scontrol release {job_id}", exc.argv, exc.returncode, exc.stderr) from None
    return record


def _clear_the_way(job_id: str, paths: Sequence[str], host: "Host", slurm: "Slurm",
                   note: Callable[[str], None]) -> None:
    """An earlier job's log and run directory with this id (or a link planted there) moved aside; where that fails,
    the job is cancelled: Slurm would write its log through whatever stays there."""
    try:
        for old, kept in host.move_aside(paths):
            note(f"an earlier job {job_id} left {old}: kept as {kept}")
    except OSError as exc:
        try:
            slurm.run(["scancel", job_id], check=False)
        except ClusterDDPError:
            pass
        raise ClusterDDPError(f"job {job_id} cancelled before it could write anything: {host.shown(paths[0])} or "
                              f"{host.shown(paths[1])} is in the way (an earlier job's files, or a link someone "
                              f"planted) and could not be moved aside ({exc}); remove it, or use another "
                              "--output-dir") from None


def _expedite(spec: "JobSpec", slurm: "Slurm") -> "JobSpec":
    """An expedited requeue where the cluster allows it (--expedite/--no-expedite decide): asked of scontrol."""
    allowed = slurm.expedited_requeue()
    if spec.expedite and not allowed:
        raise PreflightError("--expedite: this cluster does not allow an expedited requeue (scontrol show config: "
                             "SlurmctldParameters has no enable_expedited_requeue; Slurm 25.11+), so sbatch would "
                             "refuse --requeue=expedite; submit without --expedite")
    return spec.replace(expedite=allowed)
