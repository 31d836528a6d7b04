"""``clusterddp config show | trust | new``: the project's configuration, whom it trusts, a new script."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import click

from ..errors import SpecError
from .base import Command, Group


@click.group("config", cls=Group)
def config_group() -> None:
    """Profiles: defaults from clusterddp.toml ([tool.clusterddp] in pyproject.toml) and the user config."""


@config_group.command("show")
@click.option("-P", "--profile", help="Show the values with this profile applied.")
def config_show(profile: Optional[str]) -> None:
    """Print every setting with its merged value and where it came from."""
    from ..job.config import project_file, show, user_file

    text = show(profile)
    path, _ = project_file(skipped=[])
    click.echo(f"# user file:    {user_file()}{'' if user_file().is_file() else ' (none)'}")
    click.echo(f"# project file: {path or '(none: clusterddp.toml or [tool.clusterddp] in pyproject.toml)'}")
    click.echo(text, nl=False)
    from ..job.clusters import defined, human_size

    for name, (c, where) in sorted(defined().items()):
        extra = "".join(f", {k} {v}" for k, v in (("user", c.user), ("port", c.port), ("ssh_config", c.ssh_config))
                        if v)
        limit = human_size(c.max_copy) if c.max_copy else "none"
        if c.host is None:  # a backend of its own that needs no login node
            click.echo(f"# cluster {name}: backend {c.backend}  # {where}")
            continue
        backend = "" if c.backend == "slurm" else f"backend {c.backend}, "
        click.echo(f"# cluster {name}: {backend}ssh {c.host}{extra}; code copied to {c.remote_dir}/<project>; "
                   f"{len(c.setup)} setup line(s); max_copy {limit}  # {where}")


@click.command("trust", cls=Command)
@click.argument("file", required=False, type=click.Path(dir_okay=False))
@click.option("--revoke", is_flag=True, help="Forget FILE: its clusters and cluster = no longer apply.")
def trust_command(file: Optional[str], revoke: bool) -> None:
    """Let a project file (clusterddp.toml, [tool.clusterddp] in pyproject.toml) decide where code goes.

    A project's [clusters.NAME] tables and cluster = ... choose the host your code is copied to and what ssh runs
    on this machine (an ssh_config with a ProxyCommand, for example), so a repository you cloned gets them only
    once you trust it. This records FILE's path and content hash (default: the project file found from here);
    any later change to the file needs trusting again. CLUSTERDDP_TRUST=FILE also counts. Even then, a project's
    cluster never replaces one of your own of the same name.
    """
    from ..job.config import project_file
    from ..job.trust import trust, trust_file

    if file is None:
        found, _ = project_file(skipped=[])
        if found is None:
            raise SpecError("no project file here (clusterddp.toml or [tool.clusterddp] in pyproject.toml, from this "
                            "directory up to the project root): name the file, e.g. clusterddp trust clusterddp.toml")
        file = str(found)
    digest = trust(Path(file), revoke=revoke)
    if revoke:
        click.echo(f"clusterddp: no longer trusted: {Path(file).resolve()} ({trust_file()})", err=True)
    else:
        click.echo(f"clusterddp: trusted {Path(file).resolve()} (sha256 {digest[:12]}...): its [clusters.*] and "
                   f"cluster = now apply; a change to it needs `clusterddp trust` again ({trust_file()})", err=True)


@click.command("new", cls=Command)
@click.argument("path", type=click.Path(dir_okay=False))
@click.option("--force", is_flag=True, help="Overwrite PATH if it exists.")
def new_command(path: str, force: bool) -> None:
    """Write a runnable, commented DDP training script to PATH (the fastest way from a single-GPU loop to DDP)."""
    from ..job.quoting import check_no_control, shell_quote
    from ..job.skeleton import SKELETON

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
