"""``clusterddp migrate --check``: run the migrated script here as 2 emulated nodes x 2 ranks (the local backend,
CPU gloo without GPUs), each epoch cut to a few batches, and say whether it trained and how each rank's data
differed. The script runs as it is, from its own directory: what it writes, it writes."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, Dict, List, Sequence, Set, Tuple

from .. import contract
from ..datafiles import read_bounded
from ..observe import telemetry

SHAPE = ("--nodes", "2", "--procs-per-node", "2")
RANKS = 4


def run(script: Path, args: Sequence[str], steps: int, echo: Callable[[str], None]) -> Tuple[int, List[str]]:
    """Run it; the exit code and the verdict's lines."""
    out = Path(tempfile.mkdtemp(prefix="clusterddp-migrate-check-"))
    env = dict(os.environ, **{contract.CHECK_STEPS: str(steps)})
    argv = [sys.executable, "-m", "clusterddp", "submit", "--local", *SHAPE, "--quiet", "--output-dir", str(out),
            str(script), "--", *args]
    echo(f"clusterddp: check: {' '.join(argv[3:])} (each epoch cut to {steps} batches)")
    proc = subprocess.run(argv, cwd=script.parent, env=env, text=True, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT)
    for line in proc.stdout.splitlines()[-40:]:
        echo(f"  {line}")
    runs = sorted(out.glob("*/"))
    return verdict(proc.returncode, runs[-1] if runs else None)


def verdict(code: int, run_dir: object) -> Tuple[int, List[str]]:
    """Trained (exit 0, every rank took optimizer steps), and the ranks' data (disjoint shares or not)."""
    lines: List[str] = []
    if run_dir is None:
        return 1, ["check: the job did not start (no run directory)"]
    run = Path(str(run_dir))
    steps = {r.rank: r.steps for r in telemetry.read(run, 0)}  # steps ended (the summary, written at shutdown)
    trained = code == 0 and len(steps) == RANKS and min(steps.values()) > 0
    if trained:
        lines.append(f"check: trained: {RANKS} ranks on 2 emulated nodes, {min(steps.values())} steps each, exit 0")
    else:
        lines.append(f"check: did not train: exit {code}, steps per rank {steps or 'none recorded'} (the output "
                     f"above; the logs in {run})")
    in_step = _in_step(run)
    trained = trained and in_step[0]
    lines.append(in_step[1])
    shares = _shares(run)
    if not shares:
        lines.append("check: data: no runtime.loader was used, so how the ranks' data differ is not known")
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
    lines.append("check: throughput against DataParallel needs GPUs: on a GPU machine, examples/dp_vs_ddp.py "
                 "measures the same model both ways")
    return (0 if trained else 1), lines


def _in_step(run: Path) -> Tuple[bool, str]:
    """Whether the ranks ended with the same parameters (their models went through runtime.wrap)."""
    models = {}
    for path in sorted((run / "check").glob("rank-*-models.json"))[:4096]:
        try:
            data = json.loads(read_bounded(path, 1 << 20) or b"null")
        except ValueError:
            continue
        if isinstance(data, dict) and isinstance(data.get("rank"), int) and isinstance(data.get("models"), list):
            models[data["rank"]] = tuple(str(m) for m in data["models"])
    if len(models) < RANKS:
        return False, f"check: weights: {len(models)} of {RANKS} ranks recorded theirs (did each reach shutdown?)"
    if not any(models.values()):
        return False, ("check: weights: no model went through runtime.wrap, so each rank trained its own copy and "
                       "none was averaged: wrap the model whatever the GPU count (runtime.wrap(model))")
    if len(set(models.values())) > 1:
        return False, "check: weights: the ranks' parameters differ at the end: they were not kept in step"
    return True, "check: weights: every rank ended with the same parameters (DDP kept them in step)"


def _shares(run: Path) -> Dict[int, Dict[int, Set[int]]]:
    out: Dict[int, Dict[int, Set[int]]] = {}
    for path in sorted((run / "check").glob("rank-*-loader-*.json"))[:4096]:
        raw = read_bounded(path, 16 << 20)
        try:
            data = json.loads(raw or b"")
            rank, loader, indices = int(data["rank"]), int(data["loader"]), data["indices"]
        except (ValueError, KeyError, TypeError):
            continue
        out.setdefault(loader, {})[rank] = {int(i) for i in indices if isinstance(i, int)}
    return out
