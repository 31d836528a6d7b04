"""`clusterddp drill`: the Click adapter of clusterddp.drill (options -> JobSpec -> the drill -> its report card)."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import click

from .cli_base import cli
from .cli_job import build_spec, spec_options
from .contract import DRILL_SCENARIOS as SCENARIOS


@cli.command("drill")
@spec_options
@click.option("--run-timeout", type=float, default=600, show_default=True, metavar="SECONDS",
              help="Each run of the script must end within this long.")
@click.option("--drill-dir", default="clusterddp-drill", show_default=True,
              help="Where each scenario runs (a directory of its own: relative checkpoint paths stay apart).")
@click.option("--only", "only", multiple=True, type=click.Choice(SCENARIOS), metavar="SCENARIO",
              help="Run only this kind of scenario (repeatable): stop (stopped at a step, run again) or kill (an "
                   "emulated node's ranks SIGKILLed, on every node drilled). Default: both.")
@click.option("--json", "as_json", is_flag=True, help="The verdicts as JSON, for tools.")
def drill_command(script: str, args: Sequence[str], run_timeout: float, drill_dir: str, only: Sequence[str],
                  as_json: bool, template_dirs: Sequence[str], **opts: Any) -> None:
    """Prove on this machine that SCRIPT [-- ARGS...] resumes exactly, before the long run: the job runs (--local,
    emulated nodes) uninterrupted, stopped at a step and run again, and with an emulated node's ranks SIGKILLed
    after the first checkpoint and retried; the drill compares the steps, the values the script reports
    (runtime.all_reduce_mean) and the last checkpoints (runtime.Checkpointer) with the uninterrupted run's.

    Give it small arguments (a short epoch, a tiny model) and a relative checkpoint directory. Exit 0 when every
    scenario is bit-identical, 1 otherwise.
    """
    from .drill import Drill, report  # not at start-up: every other command would pay for it

    spec = build_spec(script, args, template_dirs, local=True, **opts)[0]
    if run_timeout <= 0:
        raise click.BadParameter(f"{run_timeout} is not a positive number of seconds", param_hint="--run-timeout")
    base = Path(drill_dir) / f"{spec.file_stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    def note(line: str) -> None:
        click.echo(line, err=True)

    drill = Drill(spec, base.resolve(), run_timeout, note)
    note(f"clusterddp drill: the reference run ({base}/reference/a.log) ...")
    ref, steps = drill.reference()
    note(f"clusterddp drill: {steps} steps; now the interruptions ...")
    only = tuple(dict.fromkeys(only)) or SCENARIOS  # each kind once, in the order given
    verdicts = drill.scenarios(ref, steps, only)
    if as_json:
        click.echo(json.dumps({"steps": steps, "scenarios": [v.as_json() for v in verdicts],
                               "only": list(only), "identical": all(v.identical for v in verdicts)}, indent=2))
    else:
        click.echo(report(spec, steps, verdicts, only))
    sys.exit(0 if all(v.identical for v in verdicts) else 1)
