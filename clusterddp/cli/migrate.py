"""``clusterddp migrate``: a DataParallel script rewritten for DDP, reviewed and (with --check) run."""
from __future__ import annotations

import difflib
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Sequence, Tuple

import click

from ..contract import EXIT
from ..errors import SpecError
from .base import Command

if TYPE_CHECKING:
    from ..migrate.files import Script


@click.command("migrate", cls=Command)
@click.argument("script", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), metavar="OUT",
              help="Write the migrated script here (default: SCRIPT's name with _ddp, beside it).")
@click.option("--diff", is_flag=True, help="Print the changes as a unified diff; write nothing.")
@click.option("--in-place", is_flag=True, help="Rewrite SCRIPT itself (a copy of the original is kept as SCRIPT.orig).")
@click.option("--keep-global-batch", is_flag=True,
              help="Divide each training loader's batch_size by the world size at run time, so the global batch "
                   "stays what it was under DataParallel (default: the per-GPU batch is kept, the global one grows).")
@click.option("--check", is_flag=True,
              help="Then run the migrated script here as 2 nodes x 2 ranks (CPU gloo without GPUs), each epoch cut "
                   "to --check-steps batches, and say whether it trained and how the ranks' data differed. ARGS "
                   "after -- go to the script.")
@click.option("--check-steps", type=click.IntRange(1, 1000), default=3, show_default=True, metavar="N")
@click.option("--check-hang", type=click.IntRange(5, 3600), default=60, show_default=True, metavar="SECONDS",
              help="With --check: end the check as hung when no rank has advanced for this long (the first step "
                   "gets twice as long); raise it for a model whose steps are slow on the CPU.")
@click.option("--compare-dp/--no-compare-dp", default=None,
              help="With --check: first run the original under DataParallel (one process, every GPU here) the "
                   "same way, and compare the throughput (samples/s). Default: where GPUs are. On the CPU it "
                   "compares processes, not GPUs. What the original writes, it writes too.")
def migrate_command(script: Path, args: Sequence[str], output: Optional[Path], diff: bool, in_place: bool,
                    keep_global_batch: bool, check: bool, check_steps: int, check_hang: int,
                    compare_dp: Optional[bool]) -> None:
    """From nn.DataParallel to DistributedDataParallel in one command: SCRIPT rewritten with clusterddp's runtime
    (comments and formatting kept, untouched lines byte for byte), every change listed with its line, and what
    cannot be rewritten safely listed with what to do (custom samplers, gradient accumulation without no_sync,
    evaluation on every rank, seeds, checkpoint resume, device counts in the model's logic).

    Rewritten: nn.DataParallel(model) -> runtime.wrap(model); torch.device("cuda"...) and .cuda() -> the rank's
    device; DataLoader(..., shuffle=True) -> runtime.loader (each rank its share); torch.save -> save_on_main;
    model.module -> runtime.unwrap(model); print -> print0, losses averaged; the entry point between
    runtime.init() and runtime.shutdown(). A script that already uses DDP is left alone; migrating twice changes
    nothing; SCRIPT itself is only rewritten with --in-place.

    \b
      clusterddp migrate train.py                 # writes train_ddp.py, lists the changes
      clusterddp migrate train.py --diff          # review first
      clusterddp migrate train.py --check -- --epochs 2
      clusterddp submit --nodes 2 --gpus 8 train_ddp.py -- --epochs 10
    """
    from ..migrate.rules import migrate_source, report

    if sum(map(bool, (output, diff, in_place))) > 1:
        raise SpecError("-o, --diff and --in-place are three different answers to where the result goes: give one")
    if args and not check:
        raise SpecError(f"arguments after SCRIPT ({' '.join(args)}) are for --check (the script's own arguments)")
    if compare_dp and not check:
        raise SpecError("--compare-dp compares the runs of --check: give --check too")
    from ..migrate.files import read_script

    read = read_script(script)
    source = read.text
    m = migrate_source(source, str(script), keep_global_batch)
    if m.left_alone or m.text is None:
        _left_alone(script, m.left_alone, (tuple(args), (check_steps, check_hang)) if check else None, compare_dp)
        return
    target = script if in_place else output or script.with_name(f"{script.stem}_ddp{script.suffix}")
    if diff:
        click.echo("".join(difflib.unified_diff(source.splitlines(True), m.text.splitlines(True), str(script),
                                                f"{script} (migrated)")), nl=False)
    elif not in_place and target.resolve() == script.resolve():
        raise SpecError(f"-o {output} is SCRIPT itself: use --in-place to rewrite the original")
    elif not in_place and target.exists() and output is None:
        raise SpecError(f"{target} exists already: -o OUT names another file (or remove it to migrate again)")
    for line in report(m, str(script), keep_global_batch):
        click.echo(f"clusterddp: {line}", err=True)
    if not diff:
        _write(script, target, read, m.text, in_place)
    if check:
        if compare_dp is None:
            from ..backends.local.plan import visible_gpus

            compare_dp = bool(visible_gpus())
        _check(script, target, m.text, diff, args, (check_steps, check_hang), (script, source) if compare_dp else None)


def _left_alone(script: Path, why: str, check: Optional[Tuple[Tuple[str, ...], Tuple[int, int]]],
                compare_dp: Optional[bool]) -> None:
    """Said; with --check, a script that is DDP already (an edited X_ddp.py) is checked as it is."""
    click.echo(f"clusterddp: {why}", err=True)
    if check and why.endswith("(DDP already)"):
        if compare_dp:
            raise SpecError("--compare-dp times the DataParallel original against its migration: give the "
                            "DataParallel script, not one that is DDP already")
        click.echo(f"clusterddp: checking {script} as it is", err=True)
        _check(script, script, "", False, check[0], check[1], None)
    elif check:
        sys.exit(EXIT["RUNTIME"])


def _write(script: Path, target: Path, read: "Script", text: str, in_place: bool) -> None:
    from ..migrate.files import backup, write_like

    if in_place:
        kept = backup(script, read)
        click.echo(f"clusterddp: the original is kept as {kept}", err=True)
    write_like(target, text, read)
    click.echo(f"clusterddp: wrote {target}; next: clusterddp submit --local --nodes 2 --gpus 2 {target}", err=True)


def _check(script: Path, target: Path, text: str, diff: bool, args: Sequence[str], pace: Tuple[int, int],
           original: Optional[Tuple[Path, str]]) -> None:
    """--check: the migrated script run here (with --diff, from a file of its own beside SCRIPT, removed after);
    ``pace``: --check-steps and --check-hang."""
    from ..migrate.check import private_copy, run

    checked = target
    if diff:
        checked = private_copy(script, "ddp_check", text)
    try:
        code, lines = run(checked, args, pace[0], echo=lambda line: click.echo(line, err=True), original=original,
                          hang=pace[1])
    finally:
        if diff:
            checked.unlink(missing_ok=True)
    for line in lines:
        click.echo(f"clusterddp: {line}", err=True)
    if code:
        sys.exit(EXIT["RUNTIME"])
