"""``clusterddp render | submit | explain``: options -> a validated JobSpec -> one library call."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Optional, Sequence

import click

from ..errors import SpecError
from ..job.ids import HERE, LOCAL
from ..job.quoting import shown
from ..job.spec import JobSpec
from .base import Command
from .options import EXAMPLES, build_spec, spec_options


def _print_script(text: str) -> None:
    # color=True: click strips escape sequences when stdout is not a terminal, and the printed script must be
    # byte for byte the one that would be submitted (a --setup line may hold one).
    click.echo(text, nl=False, color=True)


def _check_output_file(path: Path, spec: JobSpec) -> None:
    """-o never overwrites the training script, and says what is wrong with a path it cannot write."""
    parent = path.parent
    try:
        if not spec.module and path.exists() and Path(spec.script).exists() and path.samefile(spec.script):
            raise SpecError(f"-o {shown(str(path))} is the training script itself; write the job script "
                            "elsewhere (e.g. -o job.sbatch)")
        ok = parent.is_dir()
    except OSError as exc:  # a name too long for the file system, for one
        raise SpecError(f"cannot write -o {shown(str(path))}: {exc.strerror}") from None
    if not ok:
        raise SpecError(f"cannot write -o {shown(str(path))}: directory {shown(str(parent))} does not exist; "
                        "create it first")


def _summary(spec: JobSpec) -> str:
    per = f"{spec.gpus_per_node} GPU(s)" if spec.gpus_per_node else f"{spec.tasks_per_node} CPU rank(s)"
    return (f"{spec.nodes} node(s) x {per} = world size {spec.world_size} "
            f"({spec.launcher} launcher, {spec.dist_backend})")


def _local_next(spec: JobSpec, run_dir: Path, job_id: str) -> list:
    """Where a local run left its files, and what to run next: its observatory, then the same job on Slurm."""
    import shlex

    saved = sorted((p for pattern in ("*.pt", "*/*.pt", "*/*/*.pt") for p in run_dir.glob(pattern)),
                   key=lambda p: p.stat().st_mtime)
    out = [f"local job {job_id}: run directory {run_dir} (rank logs, steps, metrics)"]
    if saved:
        out.append(f"saved last:    {saved[-1]}")
    gpus = spec.tasks_per_node  # the same ranks, a GPU each
    argv = " ".join(shlex.quote(a) for a in spec.args)
    out.append(f"next: clusterddp status {job_id}   clusterddp top {job_id}  (each rank's steps)   "
               f"clusterddp report {job_id}  (the run in one page)   clusterddp logs {job_id} --rank 0")
    out.append(f"      on Slurm: clusterddp submit --nodes {spec.nodes} --gpus {gpus} {'-m ' if spec.module else ''}"
               f"{shlex.quote(spec.script)}"
               + (f" -- {argv}" if argv else ""))
    return out


@click.command("render", cls=Command, epilog=EXAMPLES.format(cmd="render"))
@spec_options
@click.option("-o", "--output", type=click.Path(dir_okay=False, writable=True), help="Write here instead of stdout.")
def render_command(script: str, args: Sequence[str], output: Optional[str], template_dirs: Sequence[str],
                   **opts: Any) -> None:
    """Print the sbatch script for SCRIPT [-- ARGS...] (or write it with -o FILE)."""
    from .. import backends

    spec, template_dirs, cluster = build_spec(script, args, template_dirs, **opts)
    text = backends.get(cluster).script(spec, template_dirs)
    if output:
        _check_output_file(Path(output), spec)
    # sbatch cannot create the directory of --output: a job submitted by hand from this script would fail at
    # once without it, with no log to say why.
    if not Path(spec.output_dir).is_dir():
        try:
            Path(spec.output_dir).mkdir(parents=True)
            click.echo(f"clusterddp: created {spec.output_dir}/ for the job's logs", err=True)
        except OSError as exc:
            click.echo(f"clusterddp: warning: cannot create {spec.output_dir}/ ({exc.strerror}); sbatch needs it "
                       "for the job's log", err=True)
    if output:
        try:
            Path(output).write_text(text, encoding="utf-8")
        except OSError as exc:
            raise SpecError(f"cannot write -o {shown(output)}: {exc.strerror}; choose a writable file") from None
        click.echo(f"clusterddp: wrote {output}: {_summary(spec)}", err=True)
    else:
        _print_script(text)


@click.command("submit", cls=Command, epilog=EXAMPLES.format(cmd="submit"))
@spec_options
@click.option("--dry-run", is_flag=True, help="Print the script that would be submitted; submit nothing.")
@click.option("--wait", "wait_", is_flag=True, help="Follow the job to its end; exit with the job's exit code.")
@click.option("--on-interrupt", type=click.Choice(["ask", "cancel", "detach"]), default="ask", show_default=True,
              help="What Ctrl-C during --wait does (ask only when the terminal can answer).")
@click.option("--local", is_flag=True,
              help="Run on this machine instead of Slurm: --nodes x --gpus ranks, GPUs if there are enough, else "
                   "CPU with gloo. Exit code = the job's.")
@click.option("--quiet", is_flag=True, help="With --local: show only rank 0's output (all ranks are in the logs).")
@click.option("--no-check", is_flag=True,
              help="Skip the pre-flight checks (partition, GPUs, CPUs, memory and time limit against sinfo, then "
                   "sbatch --test-only).")
def submit_command(script: str, args: Sequence[str], dry_run: bool, wait_: bool, on_interrupt: str, local: bool,
           quiet: bool, no_check: bool, template_dirs: Sequence[str], **opts: Any) -> None:
    """Submit SCRIPT [-- ARGS...] as a DDP job: render, write the script, sbatch, print the job id.

    With --local, run the same job here, no Slurm needed (try it before you have a cluster).
    """
    spec, template_dirs, cluster = build_spec(script, args, template_dirs, local=local, **opts)
    from .. import backends

    if local and not backends.host_for(cluster).files_here:
        raise SpecError(f"--local runs on this machine; --cluster {cluster.name} submits to a remote cluster: "
                        "choose one")
    backend = backends.get(LOCAL if local else cluster)  # --local is sugar for the local backend
    if quiet and not local:
        raise SpecError("--quiet only applies to --local runs (Slurm jobs write their output to logs)")
    if wait_ and spec.array:
        raise SpecError("--wait follows one job; an --array has one per task: submit without --wait and follow the "
                        "tasks with clusterddp status JOBID_TASK")
    if local:
        if dry_run:
            from ..backends.local.plan import not_applied_line

            line = not_applied_line(spec)
            if line:
                click.echo(line, err=True)
            _print_script(backend.script(spec, template_dirs))
            return
        from ..backends.local.jobs import allocate

        ran: list = []
        job_id = allocate()

        def prepare(run_dir: str) -> None:
            ran.append(run_dir)
            click.echo(f"clusterddp: local job {job_id} (clusterddp status|top|logs|cancel {job_id}), run directory "
                       f"{run_dir}", err=True)
        code = backend.run(spec, quiet=quiet, echo=click.echo, note=lambda line: click.echo(line, err=True),
                           prepare=prepare, job_id=job_id)
        from ..observe.goodput import lines

        for line in (lines(Path(ran[0])) + _local_next(spec, Path(ran[0]), job_id)) if ran else []:
            click.echo(f"clusterddp: {line}", err=True)
        sys.exit(code)
    if dry_run:
        _print_script(backend.script(spec, template_dirs))
        where = f" (for cluster {cluster.name})" if backend.host is not None and not backend.host.files_here else ""
        click.echo(f"clusterddp: dry run, nothing submitted{where}: {_summary(spec)}", err=True)
        return
    record = backend.submit(spec, template_dirs, check=not no_check,
                            note=lambda line: click.echo(f"clusterddp: {line}", err=True))
    job_id = record.job_id
    click.echo(job_id)
    where = f" on cluster {cluster.name}" if cluster.name != HERE else ""
    click.echo(f"clusterddp: submitted job {job_id}{where}: {_summary(spec)}\n"
               f"  script {record.script_path}\n  log    {record.batch_log}\n  ranks  {record.run_dir}/", err=True)
    if wait_:
        from ..observe.follow import wait

        sys.exit(wait(backend, job_id, on_interrupt, record))


@click.command("explain", cls=Command, epilog=EXAMPLES.format(cmd="explain"))
@spec_options
def explain_command(script: str, args: Sequence[str], template_dirs: Sequence[str], **opts: Any) -> None:
    """Explain the job SCRIPT [-- ARGS...] would be, without submitting: world size, the node/rank/GPU table,
    MASTER_ADDR/PORT, every variable the script sees and known mistakes."""
    from ..job.explain import explain as explain_spec

    click.echo(explain_spec(build_spec(script, args, template_dirs, **opts)[0]), nl=False)
