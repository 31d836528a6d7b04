"""``clusterddp status | cancel | logs | doctor | config show | new``: following and checking jobs."""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, List, Optional, Sequence

import click

from .cli import cli
from .errors import SpecError
from .spec import JobSpec, field_default, parse_env

D = field_default


@cli.command("status")
@click.argument("job_ids", nargs=-1)
def status_command(job_ids: Sequence[str]) -> None:
    """State, elapsed time, nodes and exit code of JOBID... (default: jobs submitted from here recently)."""
    from . import slurm
    from .record import state_dir
    from .watch import reason

    if not job_ids:
        records = sorted(state_dir().glob("*.json"), key=lambda p: p.stat().st_mtime)[-10:]
        job_ids = [p.stem for p in records]
        if not job_ids:
            raise SpecError("no job ids given and no jobs submitted with clusterddp here yet")
    rows = [("JOBID", "STATE", "ELAPSED", "NODES", "NODELIST", "EXIT", "REASON")]
    failed = 0
    for job_id in job_ids:
        try:
            j = slurm.info(job_id)
        except slurm.JobNotFound as exc:
            if len(job_ids) == 1:
                raise
            rows.append((job_id, "UNKNOWN", "", "", "", "", str(exc).split(":")[0]))
            failed += 1
            continue
        exit_ = "" if j.exit_code is None else (f"{j.exit_code}" + (f" (signal {j.signal})" if j.signal else ""))
        rows.append((j.job_id, j.state, j.elapsed, j.nodes, j.node_list, exit_, reason(j) if not j.done else
                     _why_it_ended(j.job_id)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        click.echo("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    if failed:
        sys.exit(1)


def _why_it_ended(job_id: str) -> str:
    """What the runtime reported for a job that ended: a hang's roll call in one line, a failed rendezvous."""
    from .record import JobRecord
    from .rollcall import hang_report, rendezvous_failure

    record = JobRecord.load(job_id)
    if record is None:
        return ""
    hang = hang_report(Path(record.run_dir))
    if hang is not None:
        return hang["summary"]
    return rendezvous_failure(Path(record.run_dir)) or ""


@cli.command("stacks")
@click.argument("job")
@click.option("--json", "as_json", is_flag=True, help="Print the roll call as JSON (for tools).")
@click.option("--timeout", type=float, default=10.0, show_default=True, metavar="SECONDS",
              help="How long ranks get to answer before py-spy is tried for the silent ones.")
@click.option("--no-py-spy", is_flag=True, help="Do not fall back to py-spy for ranks that do not answer.")
def stacks_command(job: str, as_json: bool, timeout: float, no_py_spy: bool) -> None:
    """Where is every rank of a running job? Collects every rank's Python stacks (all threads) and prints a roll
    call: ranks grouped by the place they wait, the odd ones out named, ranks that never started listed.

    JOB is a job id, or the run directory of a --local run. Ranks using clusterddp.runtime answer through the run
    directory (no ptrace needed); for others, py-spy is tried on their nodes (pip install 'clusterddp[stacks]').
    Every rank's full stacks are kept in RUN_DIR/stacks/<time>/.

    \b
      clusterddp stacks 123456
      clusterddp stacks clusterddp-runs/train-local-20261130-120000-4242
    """
    import json
    import re

    from . import hostlist, slurm
    from .errors import ClusterDDPError
    from .record import JobRecord
    from .stacks import Target, collect, report

    if re.fullmatch(r"[0-9]+(_[0-9]+)?", job):
        record = JobRecord.load(job)
        if record is None:
            raise SpecError(f"job {job} was not submitted with clusterddp here, so its run directory is unknown; "
                            "pass the run directory instead: clusterddp stacks RUN_DIR")
        info = slurm.info(job)
        if info.state != "RUNNING":
            raise ClusterDDPError(f"job {job} is {info.state}: only a running job has stacks to show"
                                  + (f" (its logs: clusterddp logs {job})" if info.done else ""))
        target = Target(Path(record.run_dir), record.nodes * record.procs_per_node, record.launcher,
                        record.procs_per_node, job, hostlist.expand(info.node_list) if info.node_list else ())
    elif Path(job).is_dir():
        target = Target(Path(job))
    else:
        raise SpecError(f"{job!r} is neither a job id (digits) nor an existing run directory")
    call = collect(target, timeout, note=lambda line: click.echo(f"clusterddp: {line}", err=True),
                   fallback=not no_py_spy)
    click.echo(json.dumps(call, indent=1) if as_json else report(call, target.run_dir).rstrip("\n"))
    if not call["groups"]:
        sys.exit(1)


@cli.command("cancel")
@click.argument("job_id")
def cancel_command(job_id: str) -> None:
    """Cancel JOBID (scancel)."""
    from . import slurm

    slurm.cancel(job_id)
    click.echo(f"clusterddp: cancel requested for job {job_id}", err=True)


@cli.command("logs")
@click.argument("job_id")
@click.option("--rank", type=int, help="Show this rank's output instead of the batch log.")
@click.option("-f", "--follow", is_flag=True, help="Keep printing new output until the job ends.")
def logs_command(job_id: str, rank: Optional[int], follow: bool) -> None:
    """Print the batch log of JOBID, or one rank's log with --rank N."""
    from . import slurm
    from .errors import LogNotFound
    from .record import JobRecord

    record = JobRecord.load(job_id)
    prefix = None
    if record is None:
        info = slurm.info(job_id)  # JobNotFound when Slurm never heard of it
        if not info.stdout_path:
            raise LogNotFound(f"no log path known for job {job_id} (not submitted with clusterddp here?)")
        if rank is not None:
            raise SpecError(f"job {job_id} was not submitted with clusterddp here: no rank logs known")
        path = Path(info.stdout_path)
    elif rank is None:
        path = Path(record.batch_log)
    else:
        world = record.nodes * record.procs_per_node
        if not 0 <= rank < world:
            raise SpecError(f"--rank {rank} is outside the job's ranks 0..{world - 1}")
        path, prefix = record.rank_log(rank)
        if record.launcher == "spawn":
            first = rank - rank % record.procs_per_node
            click.echo(f"clusterddp: spawn jobs log per node: {path.name} holds ranks {first}-"
                       f"{first + record.procs_per_node - 1}", err=True)
    from .watch import print_log

    print_log(job_id, path, prefix, follow)


@cli.command("doctor")
@click.option("-N", "--nodes", type=int, default=2, show_default=True)
@click.option("-G", "--gpus", "--gpus-per-node", "gpus_per_node", type=int, default=D("gpus_per_node"),
              show_default=True)
@click.option("--procs-per-node", type=int, help="Ranks per node without GPUs. [default: 1]")
@click.option("-p", "--partition")
@click.option("-A", "--account")
@click.option("-q", "--qos")
@click.option("-C", "--constraint")
@click.option("-t", "--time", default="5", show_default=True)
@click.option("-e", "--env", "env", multiple=True, metavar="NAME=VALUE")
@click.option("--setup", multiple=True, metavar="LINE")
@click.option("--python", default=D("python"), show_default=True)
@click.option("--output-dir", default=D("output_dir"), show_default=True)
@click.option("--local", is_flag=True, help="Run the check on this machine instead of Slurm.")
def doctor_command(local: bool, env: Sequence[str], **opts: Any) -> None:
    """Submit a tiny job on the requested shape that initialises the process group and times all-reduces;
    report per-rank hosts, interfaces, latency and bandwidth, and a verdict (exit 1 when something is wrong).

    \b
      clusterddp doctor --nodes 2 --gpus 8 -p gpu
    """
    from . import doctor as doc
    from . import slurm

    spec = JobSpec(doc.JOB_MODULE, module=True, launcher="srun", job_name="clusterddp-doctor", requeue=False,
                   env=parse_env(env), **opts)
    click.echo(f"clusterddp: doctor on {spec.nodes} node(s) x {spec.tasks_per_node} rank(s)", err=True)
    if local:
        from .contract import default_port
        from .local import make_plan, pick_port, run, visible_gpus

        lines: List[str] = []
        plan = make_plan(spec, os.path.join(spec.output_dir, f"clusterddp-doctor-local-{os.getpid()}"),
                         pick_port(default_port(os.getpid())), os.getpid(),
                         visible_gpus() if spec.gpus_per_node else [])
        code = run(plan, quiet=True, echo=lines.append, note=lambda line: click.echo(line, err=True))
        text = "\n".join(lines)
    else:
        record = slurm.submit(spec, note=lambda line: click.echo(f"clusterddp: {line}", err=True))
        click.echo(f"clusterddp: doctor job {record.job_id} submitted; waiting", err=True)
        code = slurm.wait(record.job_id).return_code
        log = record.rank_log(0)[0]
        text = log.read_text(errors="replace") if log.exists() else ""
    report = doc.parse(text)
    if report is None:
        raise slurm.SlurmError(f"the doctor job ended (exit code {code}) without a report; its output:\n"
                               + text[-3000:])
    click.echo(doc.format_report(report, local), nl=False)
    sys.exit(0 if doc.verdict(report, local)[0] and code == 0 else 1)


@cli.group("config")
def config_group() -> None:
    """Profiles: defaults from clusterddp.toml ([tool.clusterddp] in pyproject.toml) and the user config."""


@config_group.command("show")
@click.option("-P", "--profile", help="Show the values with this profile applied.")
def config_show(profile: Optional[str]) -> None:
    """Print every setting with its merged value and where it came from."""
    from .config import project_file, show, user_file

    text = show(profile)
    path, _ = project_file(skipped=[])
    click.echo(f"# user file:    {user_file()}{'' if user_file().is_file() else ' (none)'}")
    click.echo(f"# project file: {path or '(none: clusterddp.toml or [tool.clusterddp] in pyproject.toml)'}")
    click.echo(text, nl=False)


@cli.command("new")
@click.argument("path", type=click.Path(dir_okay=False))
@click.option("--force", is_flag=True, help="Overwrite PATH if it exists.")
def new_command(path: str, force: bool) -> None:
    """Write a runnable, commented DDP training script to PATH (the fastest way from a single-GPU loop to DDP)."""
    from .quoting import check_no_control, shell_quote
    from .skeleton import SKELETON

    check_no_control(path, "file name")
    target = Path(path)
    if target.exists() and not force:
        raise SpecError(f"{path} already exists; not overwriting it (use --force, or choose another name)")
    target.parent.mkdir(parents=True, exist_ok=True)
    # The name appears in the skeleton's docstring as a shell word: escaped for the docstring too, so that no
    # file name can end the string and write code into the script.
    shown = shell_quote(target.name).replace("\\", "\\\\").replace('"', '\\"')
    target.write_text(SKELETON.format(name=shown))
    click.echo(f"clusterddp: wrote {path}; try: clusterddp submit --local --procs-per-node 2 {path}", err=True)
