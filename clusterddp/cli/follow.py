"""``clusterddp status | nodes | stacks | top | report | cancel | logs``: following jobs that run or ran."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional, Sequence

import click

from ..contract import EXIT, LAUNCHERS
from ..errors import SpecError
from ..job.ids import HERE
from .base import CLUSTER_OPTION, Command


def _note(line: str) -> None:
    click.echo(f"clusterddp: {line}", err=True)


@click.command("status", cls=Command)
@click.argument("job_ids", nargs=-1)
@CLUSTER_OPTION
def status_command(job_ids: Sequence[str], cluster: Optional[str]) -> None:
    """State, elapsed time, nodes and exit code of JOBID... (default: the last 10 jobs submitted from here, on
    every cluster, local runs included; a CLUSTER column then says where each ran). A local run's id (L7, what
    submit --local printed) or its run directory works too: its attempts and goodput."""
    from ..backends.record import for_job, recent
    from ..job.ids import check_any_job_id as check_job_id
    from ..observe.follow import local_status, status_rows

    if len(job_ids) == 1 and Path(job_ids[0]).is_dir():
        rows, faults, failed = local_status(Path(job_ids[0]))
    elif job_ids:
        targets = [(for_job(j, cluster, note=_note).name, j) for j in (check_job_id(j) for j in job_ids)]
        rows, faults, failed = status_rows(targets)
    else:
        targets = [(r.cluster, r.job_id) for r in recent(10)]
        if not targets:
            raise SpecError("no job ids given and no jobs submitted with clusterddp here yet")
        rows, faults, failed = status_rows(targets)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        click.echo("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    for line in faults:
        if line:
            click.echo(line)
    if failed:
        sys.exit(EXIT["RUNTIME"])


@click.command("nodes", cls=Command)
@click.option("--forget", metavar="NODE", multiple=True, help="Drop NODE from the list (repeatable).")
@click.option("--from-job", "from_job", metavar="JOBID",
              help="Quarantine the nodes JOBID's faults blame (for a job not followed with submit --wait, which does "
                   "it as the job ends; status only reads).")
@CLUSTER_OPTION
def nodes_command(forget: Sequence[str], from_job: Optional[str], cluster: Optional[str]) -> None:
    """The nodes quarantined after a fault (a node killed, a hang, a rendezvous that missed it), which
    submissions leave out for 24 h (submit --no-quarantine uses them anyway): node, since, job, reason."""
    import datetime

    from ..healing import quarantine
    from ..job.clusters import choose

    if from_job is not None:
        from ..backends.record import for_job
        from ..job.ids import check_job_id
        from ..observe.follow import quarantine_job, quarantine_note

        chosen = for_job(check_job_id(from_job), cluster, note=_note)
        added = quarantine_job(from_job, chosen)
        click.echo(quarantine_note(added, chosen.name) if added else
                   f"clusterddp: job {from_job} blames no node (nothing quarantined)", err=True)
        return
    name = choose(cluster, None).name
    for node in forget:
        if not quarantine.forget(name, node):
            raise SpecError(f"node {node!r} is not quarantined on cluster {name!r} (clusterddp nodes lists them)")
        click.echo(f"clusterddp: {node} is no longer quarantined on cluster {name!r}", err=True)
    if forget:
        return
    held = quarantine.active(name)
    if not held:
        click.echo(f"no node is quarantined on cluster {name!r}")
        return
    rows = [("NODE", "SINCE", "JOB", "REASON")] + [
        (n, datetime.datetime.fromtimestamp(e["since"]).strftime("%Y-%m-%d %H:%M"), e["job"], e["reason"])
        for n, e in sorted(held.items())]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    for r in rows:
        click.echo("  ".join(c.ljust(w) for c, w in zip(r[:3], widths)) + "  " + r[3])


@click.command("stacks", cls=Command)
@click.argument("job")
@click.option("--json", "as_json", is_flag=True, help="Print the roll call as JSON (for tools).")
@click.option("--timeout", type=float, default=10.0, show_default=True, metavar="SECONDS",
              help="How long ranks get to answer before py-spy is tried for the silent ones.")
@click.option("--no-py-spy", is_flag=True, help="Do not fall back to py-spy for ranks that do not answer.")
@CLUSTER_OPTION
def stacks_command(job: str, as_json: bool, timeout: float, no_py_spy: bool, cluster: Optional[str]) -> None:
    """Where is every rank of a running job? Collects every rank's Python stacks (all threads) and prints a roll
    call: ranks grouped by the place they wait, the odd ones out named, ranks that never started listed.

    JOB is a job id, a --local run's id (L7) or its run directory. Ranks using clusterddp.runtime answer through the run
    directory (no ptrace needed); for others, py-spy is tried on their nodes (pip install 'clusterddp[stacks]').
    Every rank's full stacks are kept in RUN_DIR/stacks/<time>/.

    \b
      clusterddp stacks 123456
      clusterddp stacks clusterddp-runs/train-local-20261130-120000-4242
    """
    import json

    from ..observe.stacks import roll_call

    call, text = roll_call(job, cluster, timeout, not no_py_spy, note=lambda line: click.echo(line, err=True))
    click.echo(json.dumps(call, indent=1) if as_json else text.rstrip("\n"))
    if not call["groups"]:
        sys.exit(EXIT["RUNTIME"])


@click.command("top", cls=Command)
@click.argument("job")
@click.option("--once", is_flag=True, help="Print the table once and return (the default when not a terminal).")
@click.option("--json", "as_json", is_flag=True, help="Print the table's data once, as JSON (for tools).")
@click.option("--interval", type=click.FloatRange(0.2, 3600), default=2.0, show_default=True, metavar="SECONDS",
              help="Seconds between refreshes.")
@CLUSTER_OPTION
def top_command(job: str, once: bool, as_json: bool, interval: float, cluster: Optional[str]) -> None:
    """How fast is each rank, and why? A live table per rank (grouped by node) from the ranks' step telemetry:
    steps/s, step time p50/p95, and where the time goes: waiting for data, computing, waiting in the gradient
    all-reduce, the optimizer step, checkpoints. Below it, the straggler: the rank that holds the others back
    (in DDP every rank waits for the slowest one, so the straggler is the rank that waits least).

    JOB is a job id, a --local run's id (L7) or its run directory. Steps are what clusterddp.runtime counts: one per
    runtime.should_stop() (or runtime.step()) call; wrap() times the all-reduce, loader() the data.

    \b
      clusterddp top 123456
      clusterddp top --once clusterddp-runs/train-local-20261130-120000-4242
    """
    import json

    from ..observe.top import follow, remote_snapshot, snapshot, where

    run_dir, backend, job_id, record = where(job, cluster, "top", note=lambda line: click.echo(line, err=True))
    if backend is not None and backend.host is None:
        raise backend.unsupported("showing a job's step telemetry (clusterddp top)")
    if backend is not None and not backend.host.files_here:  # made where the files are
        def get() -> dict:
            return remote_snapshot(backend, record.python, run_dir)
    else:
        def get() -> dict:
            return snapshot(run_dir)

    def running() -> bool:
        return backend is None or not backend.info(job_id).done

    if as_json:
        click.echo(json.dumps(get(), indent=1))
        return
    try:
        snap = follow(get, click.echo, once or not sys.stdout.isatty(), interval, running)
    except KeyboardInterrupt:
        return
    if not snap["ranks"]:
        sys.exit(EXIT["RUNTIME"])


@click.command("report", cls=Command)
@click.argument("job")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), metavar="FILE",
              help="Write the HTML report here instead of RUN_DIR/report.html.")
@CLUSTER_OPTION
def report_command(job: str, output: Optional[Path], cluster: Optional[str]) -> None:
    """A job's story: one self-contained HTML file (plots embedded: it opens with no network) and a summary here.
    Compute per rank over the whole job (where a slow rank shows), where each rank's time goes, the attempts with
    their faults, the goodput ledger, and the metrics the script recorded with runtime.report (loss curves).

    JOB is a job id, a --local run's id (L7) or its run directory. The plots need matplotlib
    (pip install 'clusterddp[report]').

    \b
      clusterddp report 123456
      clusterddp report clusterddp-runs/train-local-20261130-120000-4242 -o train.html
    """
    from ..observe.report import write
    from ..observe.top import where

    run_dir, backend, _, record = where(job, cluster, "report", note=lambda line: click.echo(line, err=True))
    if backend is not None and backend.host is not None and not backend.host.files_here:
        run_dir = Path(backend.readable(record).run_dir)  # its files copied here
    path, text = write(run_dir, output)
    click.echo(text)
    if path is None:
        sys.exit(EXIT["RUNTIME"])
    click.echo(f"clusterddp: report written to {path}", err=True)


@click.command("cancel", cls=Command)
@click.argument("job_id")
@CLUSTER_OPTION
def cancel_command(job_id: str, cluster: Optional[str]) -> None:
    """Cancel JOBID (scancel)."""
    from .. import backends
    from ..backends.record import for_job

    chosen = for_job(job_id, cluster, note=_note)
    backends.get(chosen).cancel(job_id)
    where = f" on cluster {chosen.name}" if chosen.name != HERE else ""
    click.echo(f"clusterddp: cancel requested for job {job_id}{where}", err=True)


@click.command("logs", cls=Command)
@click.argument("job_id")
@click.option("--rank", type=int, help="Show this rank's output instead of the batch log.")
@click.option("-f", "--follow", is_flag=True, help="Keep printing new output until the job ends.")
@CLUSTER_OPTION
def logs_command(job_id: str, rank: Optional[int], follow: bool, cluster: Optional[str]) -> None:
    """Print the batch log of JOBID, or one rank's log with --rank N. (For a remote cluster the logs are copied
    here first, only what is new, into ~/.local/state/clusterddp/mirror/.)"""
    from .. import backends
    from ..backends.record import JobRecord, for_job
    from ..errors import LogNotFound
    from ..observe.follow import print_log

    chosen = for_job(job_id, cluster, note=_note)
    backend = backends.get(chosen)
    record = JobRecord.load(job_id, chosen.name)
    prefix = None
    if record is None:
        info = backend.info(job_id)  # JobNotFound when Slurm never heard of it
        if not info.stdout_path:
            raise LogNotFound(f"no log path known for job {job_id} (not submitted with clusterddp here?)")
        if rank is not None:
            raise SpecError(f"job {job_id} was not submitted with clusterddp here: no rank logs known")
        stdout_path = info.stdout_path

        def path_now() -> Path:
            return backend.readable_file(stdout_path, job_id)
    else:
        found = record
        if rank is not None:
            world = record.nodes * record.procs_per_node
            if not 0 <= rank < world:
                raise SpecError(f"--rank {rank} is outside the job's ranks 0..{world - 1}")
            prefix = record.rank_log(rank)[1]
            facts = LAUNCHERS[record.launcher]
            if not facts.task_per_rank and facts.line_prefix is None:  # spawn: the node's ranks share its log
                first = rank - rank % record.procs_per_node
                click.echo(f"clusterddp: spawn jobs log per node: {record.rank_log(rank)[0].name} holds ranks "
                           f"{first}-{first + record.procs_per_node - 1}", err=True)

        def path_now() -> Path:
            here = backend.readable(found)
            return Path(here.batch_log) if rank is None else here.rank_log(rank)[0]
    print_log(job_id, path_now, prefix, follow, done=lambda: backend.info(job_id).done)
