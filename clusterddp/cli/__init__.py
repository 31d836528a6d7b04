"""The ``clusterddp`` command: a thin Click adapter. Options -> JobSpec -> one library call; errors -> one line.

Never imports torch (login nodes may not have it) nor submitit. The group, its lazy table of commands and its
error path are in base.py; the commands: job.py (render, submit, explain), follow.py (status, logs, cancel, stacks,
nodes), checks.py (doctor, drill), sweep.py, project.py (config, trust, new); options.py turns the job options
into a JobSpec. Every library error reaches the user as one line with its exit code (2 usage, 1 runtime).
"""
from __future__ import annotations

from typing import List, Optional

from .base import cli

__all__ = ["cli", "main"]


def main(argv: Optional[List[str]] = None) -> None:
    cli.main(args=argv, prog_name="clusterddp")


if __name__ == "__main__":  # pragma: no cover
    main()
