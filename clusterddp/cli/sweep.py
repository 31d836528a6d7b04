"""`clusterddp sweep`: the Click adapter of sweep_flow (submit a grid, rerun trials) and sweep_status (the table).

`clusterddp sweep [options] SCRIPT -- ARGS` is `clusterddp sweep run ...`: the group hands anything that is not
one of its commands to `run`."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, List, Optional, Sequence

import click

from ..errors import SpecError
from ..job.ids import LOCAL
from .base import Group
from .options import build_spec, spec_options

EXAMPLES = """\b
Examples:
  clusterddp sweep --grid lr=0.1,0.01,0.001 --grid seed=0,1 --nodes 2 --gpus 4 train.py -- --lr {lr} --seed {seed}
  clusterddp sweep --sweep-file sweep.toml --max-parallel 4 --name lr-search train.py -- --lr {lr}
  clusterddp sweep --local --max-parallel 2 --grid lr=0.1,0.01 train.py -- --lr {lr}   # here, 2 at once
  clusterddp sweep status lr-search --sort loss
  clusterddp sweep lr-search --rerun failed
\b
A sweep file (TOML):
  [grid]
  lr = [0.1, 0.01, 0.001]
  seed = {start = 0, stop = 4}     # 0, 1, 2, 3
  [zip]                            # these vary together: (small, 64), (large, 32)
  model = ["small", "large"]
  batch = [64, 32]
"""


class SweepGroup(Group):
    """A group whose default command is `run`: `sweep --grid ... train.py` and `sweep NAME --rerun failed`."""

    def parse_args(self, ctx: click.Context, args: List[str]) -> List[str]:
        if args and args[0] not in self.commands and args[0] not in ctx.help_option_names:
            args = ["run", *args]
        return super().parse_args(ctx, args)


@click.group("sweep", cls=SweepGroup, epilog=EXAMPLES)
def sweep_group() -> None:
    """Run SCRIPT once per point of a parameter grid as ONE Slurm job array (each trial a full DDP job of the
    shape you give), see the results in one table, rerun only what failed.

    {NAME} in the script's arguments becomes the trial's value (byte for byte), and each trial sees
    CLUSTERDDP_PARAM_NAME; runtime.report(step=..., loss=...) in the script records metrics for the table. The
    trials run the code as it was at submit time (a snapshot), and a trial whose parameters and code already have
    a result is never submitted again. `clusterddp sweep run --help` lists every option.
    """


def _sweep_file(path: str) -> Any:
    from ..job.config import read_toml
    from ..sweeps.grid import parse_file

    return parse_file(read_toml(Path(path)), path)


@sweep_group.command("run", epilog=EXAMPLES)
@spec_options
@click.option("--grid", "grids", multiple=True, metavar="NAME=V1,V2,...",
              help="One parameter and its values (repeat for more: the trials are every combination).")
@click.option("--sweep-file", metavar="FILE", help="A TOML file with [grid] lists or ranges and [zip] lists.")
@click.option("--name", metavar="NAME", help="The sweep's name (default: the script's name): status and rerun use it.")
@click.option("--max-parallel", type=int, metavar="N", help="At most N trials run at once (the array's %N throttle).")
@click.option("--rerun", type=click.Choice(["failed", "missing"]), multiple=True,
              help="Resubmit the trials of sweep NAME (given instead of SCRIPT) that failed, or that never ran.")
@click.option("--local", is_flag=True, help="Run the trials here, one after another (no Slurm).")
@click.option("--dry-run", is_flag=True, help="Print the array's batch script; submit nothing.")
@click.option("--no-check", is_flag=True, help="Skip the pre-flight checks (as submit --no-check).")
def sweep_run_command(script: str, args: Sequence[str], grids: Sequence[str], sweep_file: Optional[str],
                      name: Optional[str], max_parallel: Optional[int], rerun: Sequence[str], local: bool,
                      dry_run: bool, no_check: bool, template_dirs: Sequence[str], **opts: Any) -> None:
    """Submit the trials of SCRIPT [-- ARGS...] over the grid that have no result yet, as one job array.

    With --rerun failed|missing, the first argument is the sweep's NAME instead.
    """
    from ..sweeps import flow as sweep_flow
    from ..sweeps.grid import parse_grids

    def note(line: str) -> None:  # (the local runner's lines come with their own prefix)
        click.echo(line if line.startswith("clusterddp") else f"clusterddp: {line}", err=True)

    def echo(line: str) -> None:
        click.echo(line)

    if rerun:
        if grids or sweep_file or args:
            raise SpecError("--rerun resubmits trials of an existing sweep as they were submitted: give the sweep's "
                            "name alone (clusterddp sweep NAME --rerun failed), no --grid, --sweep-file or ARGS")
        from ..job.clusters import choose

        cluster = None if local or not opts.get("cluster") else choose(opts.get("cluster"))
        out = sweep_flow.rerun(script, rerun, cluster, max_parallel, template_dirs, not no_check, note, local, echo)
    else:
        axes = parse_grids(grids) + (_sweep_file(sweep_file) if sweep_file else [])
        spec, template_dirs, cluster = build_spec(script, args, template_dirs, local=local, **opts)
        from .. import backends

        if local and not backends.host_for(cluster).files_here:
            raise SpecError(f"--local runs here; --cluster {cluster.name} is a remote cluster: choose one")
        if dry_run:
            _dry_run(spec, axes, name, max_parallel, template_dirs, cluster)
            return
        out = sweep_flow.run(spec, axes, name, cluster, max_parallel, template_dirs, not no_check, local, note, echo)
    if out.job_id and out.job_id != LOCAL:
        click.echo(out.job_id)
        note(f"sweep {out.name}: {len(out.submitted)} trial(s) submitted as array job {out.job_id}; follow them "
             f"with: clusterddp sweep status {out.name}")
    sys.exit(out.exit_code)


def _dry_run(spec: Any, axes: Any, name: Optional[str], max_parallel: Optional[int], template_dirs: Any,
             cluster: Any) -> None:
    from .. import backends
    from ..sweeps.grid import job_array
    from ..sweeps.run import plan, sweep_dir_for

    p = plan(spec, axes, name, Path.cwd())
    tasks = job_array(p.name, p.trials, spec.args)
    spec = spec.replace(array=tasks.indices(max_parallel), sweep=tasks, output_dir=sweep_dir_for(spec, p.name, True))
    click.echo(backends.get(cluster).script(spec, template_dirs), nl=False)
    click.echo(f"clusterddp: dry run, nothing submitted: sweep {p.name}, {len(p.trials)} trial(s) as one array "
               f"({spec.array}); the job runs a snapshot of the code made at submit time", err=True)


@sweep_group.command("status")
@click.argument("name")
@click.option("--sort", metavar="METRIC", help="Order by METRIC's best value, best first.")
@click.option("--maximize", multiple=True, metavar="METRIC", help="METRIC is better when larger (acc, f1, ... are).")
@click.option("--minimize", multiple=True, metavar="METRIC", help="METRIC is better when smaller (the default).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per trial, for tools.")
@click.option("--csv", "as_csv", is_flag=True, help="CSV, one row per trial.")
@click.option("--cluster", metavar="NAME", help="The cluster it ran on (when sweeps of this name ran on several).")
@click.option("--local", is_flag=True, help="The sweep that ran here with --local.")
def sweep_status_command(name: str, sort: Optional[str], maximize: Sequence[str], minimize: Sequence[str],
                         as_json: bool, as_csv: bool, cluster: Optional[str], local: bool) -> None:
    """The trials of sweep NAME: parameters, state, the last and best value of each metric, elapsed time (one
    squeue call for the whole sweep)."""
    from ..sweeps import status as sweep_status
    from ..sweeps.run import LOCAL_RECORDS, SweepRecord

    if as_json and as_csv:
        raise SpecError("--json and --csv: choose one")
    record = SweepRecord.load(name, LOCAL_RECORDS if local else cluster)
    problems: List[str] = []
    rows = sweep_status.ordered(sweep_status.states(record, maximize, minimize, problems), sort, maximize, minimize)
    if sort and not any(sort in r.best for r in rows):
        known = sweep_status.metric_names(rows)
        raise SpecError(f"--sort {sort}: no trial reported that metric (reported: {', '.join(known) or 'none yet'})")
    if as_json or as_csv:
        for problem in problems:  # (the table says these below it; tools get them on stderr)
            click.echo(f"clusterddp: not read: {problem}", err=True)
    if as_json:
        click.echo(sweep_status.as_json(rows))
    elif as_csv:
        click.echo(sweep_status.as_csv(rows), nl=False)
    else:
        click.echo(sweep_status.table(record, rows, maximize, minimize, problems), nl=False)
