"""``clusterddp migrate --check``: run the migrated script here as 2 emulated nodes x 2 ranks (the local backend,
CPU gloo without GPUs), each epoch cut to a few batches, and say whether it trained and how each rank's data
differed. The script runs as it is, from its own directory: what it writes, it writes."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple, Union

from .. import contract
from ..backends.local.plan import visible_gpus
from ..datafiles import parse_json, read_bounded
from ..errors import ClusterDDPError
from ..observe import telemetry

SHAPE = ("--nodes", "2", "--procs-per-node", "2")
HANG_S = 60  # a check's steps are short: a minute without progress is a hang (a job's default is 15 minutes)
RANKS = 4


def run(script: Path, args: Sequence[str], steps: int, echo: Callable[[str], None],
        original: Optional[Tuple[Path, str]] = None, hang: int = HANG_S) -> Tuple[int, List[str]]:
    """Run it; the exit code and the verdict's lines. ``original``: the script before migration (path, text), to
    time under DataParallel first (one process, every GPU here), the same way (--compare-dp). ``hang``: seconds
    without progress on any rank before the job is ended as hung (its first step gets twice as long)."""
    dp = _original(*original, args, steps, echo) if original is not None else None
    out = Path(tempfile.mkdtemp(prefix="clusterddp-migrate-check-"))
    env = dict(os.environ, **{contract.CHECK_STEPS: str(steps)})
    argv = [sys.executable, "-m", "clusterddp", "submit", "--local", *SHAPE, "--quiet", "--output-dir", str(out),
            "--hang-timeout", f"{hang // 60}:{hang % 60:02d}", str(script), "--", *args]
    echo(f"clusterddp: check: {' '.join(argv[3:])} (each epoch cut to {steps} batches)")
    returncode, output = _child(argv, script.parent, env)
    for line in output.splitlines()[-40:]:
        echo(f"  {line}")
    runs = sorted(out.glob("*/"))
    code, lines = verdict(returncode, runs[-1] if runs else None)
    if returncode == contract.HANG_EXIT:
        reached = {r.rank: r.steps for r in telemetry.read(runs[-1], 0)} if runs else {}
        apart = f"; steps each rank had ended: {', '.join(f'rank {r} {n}' for r, n in sorted(reached.items()))}" + (
            " (apart)" if len(set(reached.values())) > 1 else "") if reached else ""
        lines.insert(0, f"check: hung: no rank advanced for {hang} s, so the job was ended (--check-hang){apart}; "
                        "where each rank waited is in the roll call above: a collective (print of an average, a "
                        "save that waits, a backward) that only some ranks reach?")
    if original is not None:
        lines[-1] = compared(dp, throughput(runs[-1]) if runs else None, len(visible_gpus()))
    return code, lines


def _original(script: Path, source: str, args: Sequence[str], steps: int,
              echo: Callable[[str], None]) -> Union[str, Tuple[float, float, int]]:
    """The original under DataParallel, one process, timed (throughput), or why it was not."""
    from .rules import measuring_source

    out = Path(tempfile.mkdtemp(prefix="clusterddp-migrate-dp-"))
    variant = private_copy(script, "dp_check", measuring_source(source))
    env = dict(os.environ, **{contract.CHECK_STEPS: str(steps), contract.RUN_DIR: str(out)})
    echo(f"clusterddp: check: the original under DataParallel, one process: {variant.name} {' '.join(args)}")
    try:
        returncode, output = _child([sys.executable, str(variant), *args], script.parent, env)
    finally:
        variant.unlink(missing_ok=True)
    for line in output.splitlines()[-12:]:
        echo(f"  {line}")
    measured = throughput(out)
    if returncode != 0 or measured is None:
        return f"it ended with exit {returncode}" if returncode else "too few steps recorded"
    return measured


def private_copy(script: Path, what: str, text: str) -> Path:
    """``text`` in a new file beside ``script`` (its imports resolve as the script's), a name nobody has: a file
    of the user's is never overwritten or removed. The caller removes it."""
    import io
    import tokenize

    # the encoding its coding line names (ASCII, so read from the UTF-8 bytes alike), as Python will read it
    encoding, _ = tokenize.detect_encoding(io.BytesIO(text.encode("utf-8")).readline)
    fd, name = tempfile.mkstemp(prefix=f".{script.stem}_{what}_", suffix=script.suffix, dir=script.parent)
    with os.fdopen(fd, "wb") as fh:
        fh.write(text.encode(encoding))
    return Path(name)


class Ended(ClusterDDPError):
    """The check was ended from outside (SIGTERM, Ctrl-C); what it started was ended with it."""


def _child(argv: List[str], cwd: Path, env: Dict[str, str]) -> Tuple[int, str]:
    """Run ``argv`` (its output captured) in a session of its own; a SIGTERM, SIGHUP or Ctrl-C here ends it and
    every process it started (the drill's end_run: Ctrl-C to it, which stops its ranks; then whatever is left), so
    nothing the check started outlives it."""
    from ..backends.local.tree import end_run

    proc = subprocess.Popen(argv, cwd=cwd, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)

    def on_term(signum: int, frame: object) -> None:
        raise Ended(f"check: ended by {signal.Signals(signum).name}; the job it ran was stopped too")

    main = threading.current_thread() is threading.main_thread()
    previous = {sig: signal.signal(sig, on_term) for sig in (signal.SIGTERM, signal.SIGHUP)} if main else {}
    try:
        out, _ = proc.communicate()
        return proc.returncode, out
    except (Ended, KeyboardInterrupt):
        end_run(proc)
        raise
    finally:
        for sig, before in previous.items():
            signal.signal(sig, before)


def throughput(run: Path) -> Optional[Tuple[float, float, int]]:
    """(samples/s, median step time, samples per step) of a check's ranks: their telemetry's median step and the
    batch size of each rank's first loader."""
    table = telemetry.rank_table(telemetry.read(run, 0))
    batch = 0
    for path in sorted((run / "check").glob("rank-*-loader-0.json"))[:4096]:
        try:
            batch += int(parse_json(read_bounded(path, 16 << 20) or b"")["batch_size"])
        except (ValueError, KeyError, TypeError):
            return None
    steps = sorted(r["step_p50_s"] for r in table if r["steps"] > 1 and r["step_p50_s"])
    if not steps or len(steps) != len(table) or not batch:
        return None
    median = steps[len(steps) // 2]
    return batch / median, median, batch


def compared(dp: object, ddp: Optional[Tuple[float, float, int]], gpus: int) -> str:
    """The seed's comparison, measured: the original under DataParallel against the migrated script under DDP."""
    where = f"{gpus} GPU(s)" if gpus else "the CPU (no GPU here: this compares processes, not GPUs)"
    if not isinstance(dp, tuple) or ddp is None:
        why = dp if isinstance(dp, str) else "the migrated run recorded too few steps"
        hint = "; --check-steps 5 or more" if "steps" in why else ": its output above"
        return f"check: throughput against DataParallel on {where}: not measured ({why}{hint})"
    return (f"check: throughput on {where}: the original under DataParallel, 1 process: {dp[0]:.1f} samples/s "
            f"({dp[2]} a step, median step {dp[1] * 1000:.3f} ms); migrated, DDP, {RANKS} ranks: {ddp[0]:.1f} "
            f"samples/s ({ddp[2]} a step, median step {ddp[1] * 1000:.3f} ms): {ddp[0] / dp[0]:.2f}x")


def verdict(code: int, run_dir: object) -> Tuple[int, List[str]]:
    """Trained (exit 0, every rank took optimizer steps), and the ranks' data (disjoint shares or not)."""
    lines: List[str] = []
    if run_dir is None:
        return 1, ["check: the job did not start (no run directory)"]
    run = Path(str(run_dir))
    # each rank's optimizer steps (counted by torch's hook, whatever the optimizers are called); else the steps
    # its telemetry ended (the summary, written at shutdown)
    steps = {r: int(d["optimizer_steps"]) for r, d in _records(run).items()
             if isinstance(d.get("optimizer_steps"), int)}
    what = "optimizer steps"
    if len(steps) < RANKS:
        steps, what = {r.rank: r.steps for r in telemetry.read(run, 0)}, "steps"
    trained = code == 0 and len(steps) == RANKS and min(steps.values()) > 0
    if trained:
        lines.append(f"check: trained: {RANKS} ranks on 2 emulated nodes, {min(steps.values())} {what} each, exit 0")
    elif code == 0 and len(steps) == RANKS and what == "optimizer steps":
        lines.append("check: did not train: exit 0, but no rank took an optimizer step in the batches it ran (each "
                     "epoch cut to --check-steps batches: a script that steps every k batches, gradient "
                     "accumulation, needs --check-steps above k)")
    else:
        lines.append(f"check: did not train: exit {code}, steps per rank {steps or 'none recorded'} (the output "
                     f"above; the logs in {run})")
    in_step = _in_step(run)
    trained = trained and in_step[0]
    lines.append(in_step[1])
    shares = _shares(run)
    if not shares:
        lines.append("check: data: no runtime.loader was used, so how the ranks' data differ is not known")
    elif not list((run / "check").glob("rank-*-second-epoch"))[:1]:
        lines.append("check: one epoch only: a second (the sampler's new shuffle, what the script does at an "
                     "epoch's end, a loader made anew) was not run; give the script 2 or more epochs after --")
    for loader, by_rank in sorted(shares.items()):
        seen = [s for _, s in sorted(by_rank.items())]
        shared = set.intersection(*seen) if len(seen) == RANKS else set()
        overlap = sum(len(a & b) for i, a in enumerate(seen) for b in seen[i + 1:])
        sizes = sorted({len(s) for s in seen})
        if len(seen) == RANKS and overlap == 0:
            lines.append(f"check: data (loader {loader + 1}): each rank saw its own samples ({RANKS} ranks x "
                         f"{'/'.join(map(str, sizes))} in the first epoch's first batches, none shared)")
        else:
            trained = False
            lines.append(f"check: data (loader {loader + 1}): ranks share samples ({overlap} pairs, {len(shared)} "
                         "seen by all): a sampler that does not split the data per rank?")
    lines.append("check: throughput against DataParallel: not measured (--compare-dp, the default where GPUs are; "
                 "examples/dp_vs_ddp.py measures a model both ways)")
    return (0 if trained else 1), lines


def _in_step(run: Path) -> Tuple[bool, str]:
    """Whether the ranks ended with the same parameters (their models went through runtime.wrap)."""
    models = {r: tuple(str(m) for m in d["models"]) for r, d in _records(run).items()
              if isinstance(d.get("models"), list)}
    if len(models) < RANKS:
        return False, f"check: weights: {len(models)} of {RANKS} ranks recorded theirs (did each reach shutdown?)"
    if not any(models.values()):
        return False, ("check: weights: no model went through runtime.wrap, so each rank trained its own copy and "
                       "none was averaged: wrap the model whatever the GPU count (runtime.wrap(model))")
    if len(set(models.values())) > 1:
        return False, "check: weights: the ranks' parameters differ at the end: they were not kept in step"
    return True, "check: weights: every rank ended with the same parameters (DDP kept them in step)"


def _records(run: Path) -> Dict[int, Dict[str, Any]]:
    """What each rank wrote at shutdown (its models' digests, its optimizer steps), by rank."""
    out: Dict[int, Dict[str, Any]] = {}
    for path in sorted((run / "check").glob("rank-*-models.json"))[:4096]:
        try:
            data = parse_json(read_bounded(path, 1 << 20) or b"null")
        except ValueError:
            continue
        if isinstance(data, dict) and isinstance(data.get("rank"), int):
            out[data["rank"]] = data
    return out


def _shares(run: Path) -> Dict[int, Dict[int, Set[int]]]:
    out: Dict[int, Dict[int, Set[int]]] = {}
    for path in sorted((run / "check").glob("rank-*-loader-*.json"))[:4096]:
        raw = read_bounded(path, 16 << 20)
        try:
            data = parse_json(raw or b"")
            rank, loader, indices = int(data["rank"]), int(data["loader"]), data["indices"]
        except (ValueError, KeyError, TypeError):
            continue
        out.setdefault(loader, {})[rank] = {int(i) for i in indices if isinstance(i, int)}
    return out
