"""The ``clusterddp`` command: a thin Click adapter. Options -> JobSpec -> one library call; errors -> one line.

Never imports torch (login nodes may not have it) nor submitit. The group and its error path are in cli_base.py;
the commands live in cli_job.py (render, submit, explain: building a job) and cli_tools.py (status, cancel, logs,
stacks, doctor, config, new); every library error reaches the user as one line with its exit code (2 usage,
1 runtime).
"""
from __future__ import annotations

from typing import List, Optional

from . import cli_drill, cli_job, cli_sweep, cli_tools  # noqa: F401  (registers the commands on `cli`)
from .cli_base import cli

__all__ = ["cli", "main"]


def main(argv: Optional[List[str]] = None) -> None:
    cli.main(args=argv, prog_name="clusterddp")


if __name__ == "__main__":  # pragma: no cover
    main()
