"""``clusterddp doctor | drill``: checks before the long run (the process group and its speed; exact resume)."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

import click

from ..contract import DRILL_SCENARIOS as SCENARIOS
from ..contract import EXIT
from ..job.ids import LOCAL
from ..job.spec import JobSpec, field_default, parse_env
from .base import CLUSTER_OPTION, Command
from .options import build_spec, spec_options

D = field_default


@click.command("doctor", cls=Command)
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
@CLUSTER_OPTION
def doctor_command(local: bool, env: Sequence[str], cluster: Optional[str], **opts: Any) -> None:
    """Submit a tiny job on the requested shape that initialises the process group and times all-reduces;
    report per-rank hosts, interfaces, latency and bandwidth, and a verdict (exit 1 when something is wrong).

    \b
      clusterddp doctor --nodes 2 --gpus 8 -p gpu
    """
    from .. import doctor as doc
    from ..job.clusters import choose

    chosen = choose(None if local else cluster)
    spec = JobSpec(doc.JOB_MODULE, module=True, launcher="srun", job_name="clusterddp-doctor", requeue=False,
                   env=parse_env(env), **opts)
    click.echo(f"clusterddp: doctor on {spec.nodes} node(s) x {spec.tasks_per_node} rank(s)", err=True)
    code, report = doc.run_check(spec, chosen, local, note=lambda line: click.echo(line, err=True))
    click.echo(doc.format_report(report, local), nl=False)
    sys.exit(EXIT["OK"] if doc.verdict(report, local)[0] and code == 0 else EXIT["RUNTIME"])


@click.command("drill", cls=Command)
@spec_options
@click.option("--run-timeout", type=float, default=600, show_default=True, metavar="SECONDS",
              help="Each run of the script must end within this long.")
@click.option("--drill-dir", default="clusterddp-drill", show_default=True,
              help="Where each scenario runs (a directory of its own: relative checkpoint paths stay apart).")
@click.option("--only", "only", multiple=True, type=click.Choice(SCENARIOS), metavar="SCENARIO",
              help="Run only this kind of scenario (repeatable): stop (stopped at a step, run again) or kill (an "
                   "emulated node's ranks SIGKILLed). Default: both.")
@click.option("--every-node", is_flag=True,
              help="Kill each emulated node in turn, one scenario each (default: node 0 only, rank 0's: every rank "
                   "of the retry starts again, so another node's loss proves nothing more about the script).")
@click.option("--json", "as_json", is_flag=True, help="The verdicts as JSON, for tools.")
def drill_command(script: str, args: Sequence[str], run_timeout: float, drill_dir: str, only: Sequence[str],
                  every_node: bool, as_json: bool, template_dirs: Sequence[str], **opts: Any) -> None:
    """Prove on this machine that SCRIPT [-- ARGS...] resumes exactly, before the long run: the job runs (--local,
    emulated nodes) uninterrupted, and with an emulated node's ranks SIGKILLed after the first checkpoint and
    retried, then, in the same job, stopped at a step and run again (where that job differs, each scenario
    runs alone to name the cause); the drill compares the steps, the values the script reports
    (runtime.all_reduce_mean) and the last checkpoints (runtime.Checkpointer) with the uninterrupted run's.

    By default 2 emulated nodes x 2 ranks, so that losing a node leaves one (--nodes 1 for one node). Give it small
    arguments (a short epoch, a tiny model); checkpoints under $CLUSTERDDP_RUN_DIR (kept across a
    scenario's runs, as a requeued job keeps it) or in a relative directory. Exit 0 when every
    scenario is bit-identical, 1 otherwise.
    """
    from ..drill import Drill, drill_base, report  # not at start-up: every other command would pay for it

    if opts.get("cluster"):
        from .. import backends
        from ..job.clusters import choose

        chosen = choose(opts["cluster"], opts.get("profile"))
        if chosen.backend != LOCAL:  # the drill stops and kills emulated nodes: only the local backend has them
            raise backends.get(chosen).unsupported("the drill (it runs on this machine, the local backend: drop "
                                                   "--cluster)")
    given = click.get_current_context().get_parameter_source
    if given("nodes") is click.core.ParameterSource.DEFAULT and opts.get("nodes") == 1:
        opts["nodes"] = 2  # a lost node needs a second one: 2 emulated nodes unless told otherwise
        if not opts.get("gpus_per_node") and opts.get("procs_per_node") is None:
            opts["procs_per_node"] = 2
    spec = build_spec(script, args, template_dirs, local=True, **opts)[0]
    if run_timeout <= 0:
        raise click.BadParameter(f"{run_timeout} is not a positive number of seconds", param_hint="--run-timeout")
    base = drill_base(Path(drill_dir), spec.file_stem)

    def note(line: str) -> None:
        click.echo(line, err=True)

    drill = Drill(spec, base.resolve(), run_timeout, note, every_node)
    note(f"clusterddp drill: the reference run ({base}/reference/a.log) ...")
    only = tuple(dict.fromkeys(only)) or SCENARIOS  # each kind once, in the order given
    try:
        steps, verdicts = drill.all(only)
    except KeyboardInterrupt:  # (Drill.run has ended the run in flight and its ranks)
        note(f"clusterddp drill: stopped (Ctrl-C); every run it started has ended; its files: {base}/")
        sys.exit(EXIT["INTERRUPTED"])
    if as_json:
        click.echo(json.dumps({"steps": steps, "scenarios": [v.as_json() for v in verdicts],
                               "only": list(only), "identical": all(v.identical for v in verdicts)}, indent=2))
    else:
        click.echo(report(spec, steps, verdicts, only))
    sys.exit(0 if all(v.identical for v in verdicts) else 1)


def _drill_help(command: click.Command) -> None:
    """The drill's --help says its own defaults (2 emulated nodes x 2 ranks) and lists no option that only a Slurm
    job uses (they are still accepted: a submit line copied as it is runs)."""
    slurm_only = {"partition", "account", "qos", "constraint", "exclusive", "exclude", "sbatch_args", "gpu_request",
                  "expedite", "container_image", "apptainer", "array", "after", "template", "template_dirs",
                  "max_requeues"}
    for param in command.params:
        if param.name == "nodes" and isinstance(param, click.Option):
            param.show_default, param.help = False, "Emulated nodes, on this machine. [default: 2]"
        elif param.name == "procs_per_node" and isinstance(param, click.Option):
            param.help = "Ranks per emulated node without GPUs. [default: 2 where --nodes is left out, else 1]"
        elif param.name in slurm_only and isinstance(param, click.Option):
            param.hidden = True


_drill_help(drill_command)
