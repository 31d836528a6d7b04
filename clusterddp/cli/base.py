"""The ``clusterddp`` group, its one error path, and the options several commands share.

The group knows its commands by name (``COMMANDS``: name -> "module:attribute") and imports a command's module
only when that command runs (or --help lists them), so ``submit`` never pays for ``sweep`` or ``drill``. Imports
no command module itself: each command module imports this one.
"""
from __future__ import annotations

import importlib
from typing import Any, ClassVar, Dict, List, Optional, Type

import click

from ..errors import ClusterDDPError
from ..rollcall import printable
from ..version import __version__


class CLIError(click.ClickException):
    """A ClusterDDPError shown as one line. Its exit code (2 usage, 1 runtime) is a class attribute, as click
    declares it (a ClassVar since click 8.2): ``CLIError.of(error)`` picks the subclass for the error's code."""

    _by_code: ClassVar[Dict[int, Type["CLIError"]]] = {}

    @classmethod
    def of(cls, error: ClusterDDPError) -> "CLIError":
        code = error.exit_code
        if code not in cls._by_code:
            cls._by_code[code] = type(f"CLIError{code}", (cls,), {"exit_code": code})
        return cls._by_code[code](str(error))

    def show(self, file: Any = None) -> None:
        # Errors carry what commands printed (a remote login node's stderr among them): data, shown printable.
        click.echo(f"clusterddp: error: {printable(self.format_message())}", err=True)


class Command(click.Command):
    """Turns library errors into CLIError and hints at '--' when script options were mistaken for ours."""

    def parse_args(self, ctx: click.Context, args: List[str]) -> List[str]:
        try:
            return super().parse_args(ctx, args)
        except click.NoSuchOption as exc:
            if not any(p.name == "script" for p in self.params):
                raise
            # A new exception rather than an edited one: click's message is Final (click 8.2 and later).
            raise click.NoSuchOption(exc.option_name, message=exc.message + (
                f"\n(if {exc.option_name} is meant for your training script, put script arguments after --, e.g. "
                "clusterddp submit train.py -- --epochs 10)"), possibilities=exc.possibilities, ctx=exc.ctx) from None

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ClusterDDPError as exc:
            raise CLIError.of(exc) from None


class Group(click.Group):
    command_class = Command
    group_class = type  # sub-groups (config) are Groups too: one error path everywhere


#: Every command of ``clusterddp``: name -> "module:attribute" (imported when the command is asked for).
COMMANDS: Dict[str, str] = {
    "render": "clusterddp.cli.job:render_command",
    "submit": "clusterddp.cli.job:submit_command",
    "explain": "clusterddp.cli.job:explain_command",
    "status": "clusterddp.cli.follow:status_command",
    "logs": "clusterddp.cli.follow:logs_command",
    "cancel": "clusterddp.cli.follow:cancel_command",
    "stacks": "clusterddp.cli.follow:stacks_command",
    "top": "clusterddp.cli.follow:top_command",
    "report": "clusterddp.cli.follow:report_command",
    "nodes": "clusterddp.cli.follow:nodes_command",
    "doctor": "clusterddp.cli.checks:doctor_command",
    "drill": "clusterddp.cli.checks:drill_command",
    "sweep": "clusterddp.cli.sweep:sweep_group",
    "config": "clusterddp.cli.project:config_group",
    "trust": "clusterddp.cli.project:trust_command",
    "new": "clusterddp.cli.project:new_command",
    "migrate": "clusterddp.cli.migrate:migrate_command",
}


class LazyGroup(Group):
    """The top-level group: its commands come from ``COMMANDS`` on first use."""

    def list_commands(self, ctx: click.Context) -> List[str]:
        return sorted(set(COMMANDS) | set(self.commands))

    def get_command(self, ctx: click.Context, cmd_name: str) -> Optional[click.Command]:
        if cmd_name in self.commands or cmd_name not in COMMANDS:
            return super().get_command(ctx, cmd_name)
        module, _, attribute = COMMANDS[cmd_name].partition(":")
        command = getattr(importlib.import_module(module), attribute)
        self.add_command(command, cmd_name)
        return command


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(__version__, prog_name="clusterddp")
def cli() -> None:
    """DistributedDataParallel on Slurm, as easy as nn.DataParallel.

    \b
      clusterddp submit --nodes 2 --gpus 8 train.py -- --epochs 10
      clusterddp submit --dry-run ...   print the sbatch script, submit nothing
      clusterddp render ... -o job.sh   write the script to a file
      clusterddp status / logs / cancel JOBID
      clusterddp explain ...            world size, rank table, environment, warnings
      clusterddp new train.py           write a DDP training skeleton
      clusterddp doctor --nodes 2 ...   check the process group, interfaces and all-reduce speed
      clusterddp trust clusterddp.toml  let a project file choose clusters (where code goes)
    """


CLUSTER_OPTION = click.option(
    "--cluster", metavar="NAME",
    help="The Slurm cluster: [clusters.NAME] of the config, reached over SSH from here ('here': this machine's "
         "Slurm) [default: $CLUSTERDDP_CLUSTER, else cluster = ... in the config, else here].")
