"""The ``clusterddp`` command: a thin Click adapter. Options -> JobSpec -> one library call; errors -> one line.

Never imports torch (login nodes may not have it) nor submitit. The commands live in cli_job.py (render, submit,
explain: building a job) and cli_tools.py (status, cancel, logs, doctor, config, new); every library error reaches
the user through ``Command.invoke`` as one line with its exit code (2 usage, 1 runtime).
"""
from __future__ import annotations

from typing import Any, List, Optional

import click

from . import __version__
from .errors import ClusterDDPError


class CLIError(click.ClickException):
    """A ClusterDDPError shown as one line, with its own exit code (2 usage, 1 runtime)."""

    def __init__(self, error: ClusterDDPError) -> None:
        super().__init__(str(error))
        self.exit_code = error.exit_code

    def show(self, file: Any = None) -> None:
        click.echo(f"clusterddp: error: {self.format_message()}", err=True)


class Command(click.Command):
    """Turns library errors into CLIError and hints at '--' when script options were mistaken for ours."""

    def parse_args(self, ctx: click.Context, args: List[str]) -> List[str]:
        try:
            return super().parse_args(ctx, args)
        except click.NoSuchOption as exc:
            if any(p.name == "script" for p in self.params):
                exc.message += (f"\n(if {exc.option_name} is meant for your training script, put script arguments "
                                "after --, e.g. clusterddp submit train.py -- --epochs 10)")
            raise

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ClusterDDPError as exc:
            raise CLIError(exc) from None


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
    """


def main(argv: Optional[List[str]] = None) -> None:
    cli.main(args=argv, prog_name="clusterddp")


from . import cli_job, cli_tools  # noqa: E402,F401  (registers the commands on `cli`)

if __name__ == "__main__":  # pragma: no cover
    main()
