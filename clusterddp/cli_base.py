"""The Click group every command registers on, its one error path, and the options several commands share.

Imports no command module, so cli_job and cli_tools import it (and each other never); cli.py puts them together.
"""
from __future__ import annotations

from typing import Any, ClassVar, Dict, List, Type

import click

from .errors import ClusterDDPError
from .rollcall import printable
from .version import __version__


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


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
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
