"""Bench item 16 (issue 42): what the step telemetry costs a training run, and what `top` costs per refresh.

- examples/train_ddp.py under torchrun, 2 ranks on the CPU, telemetry on / off (CLUSTERDDP_TELEMETRY), interleaved
  and each first in turn, median of six each: the ratio of images/s (target <= 1.01 slower).
- `top` over 64 emulated ranks' files of the steps the runtime keeps (KEEP): one refresh (read, straggler
  verdict, table) in-process, against the baseline of only reading and parsing the same files (json.loads).
"""
from __future__ import annotations

import json
import os
import random
import statistics
import timeit
from pathlib import Path
from typing import Callable, List, Tuple

Row = Tuple[str, str, str, str]


def telemetry_cost(rows: List[Row], work: Path, root: Path, on_off: Callable[..., Tuple[List[float], List[float]]]
                   ) -> None:
    base = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(root))
    (work / "tel").mkdir(exist_ok=True)
    on = dict(base, CLUSTERDDP_RUN_DIR=str(work / "tel"), CLUSTERDDP_TELEMETRY="1")
    with_it, without = on_off(on, dict(on, CLUSTERDDP_TELEMETRY="0"), work)
    a, b = statistics.median(with_it), statistics.median(without)
    rows.append(("16", "train_ddp.py images/s, 2 ranks CPU: step telemetry off / on (slowdown)",
                 f"{b:.1f} / {a:.1f} = {b / a:.3f} (spread of single runs: {min(with_it + without):.1f}-"
                 f"{max(with_it + without):.1f})", "<= 1.01"))


def top_cost(rows: List[Row], work: Path) -> None:
    from clusterddp import contract
    from clusterddp.observe import top
    from clusterddp.runtime.telemetry import KEEP

    directory = work / "top64" / contract.TELEMETRY_FILE.format(restarts=0, rank=0).rsplit("/", 1)[0]
    directory.mkdir(parents=True, exist_ok=True)
    rng = random.Random(1)
    for rank in range(64):
        t, recent = 1.8e9, []
        for step in range(1, KEEP + 1):
            c = 0.02 * (1 + rng.uniform(-0.05, 0.05)) + (0.01 if rank == 9 else 0)
            w = 0.0 if rank == 9 else 0.01
            t += 0.001 + c + w
            recent.append([step, round(t, 3), 0.001 + c + w, 0.0005, c, w, 0.0005, 0.0])
        sums = {k: sum(r[i + 2] for r in recent) for i, k in enumerate(contract.TELEMETRY_ROW[2:])}
        (directory / f"rank-{rank}.json").write_text(json.dumps(
            {"version": 1, "rank": rank, "world_size": 64, "local_world_size": 8, "restart": 0, "node": f"n{rank // 8}",
             "pid": 1, "init": 1.8e9, "first": 1.8e9, "steps": KEEP, "base": 0, "based": None, "written": t,
             "sums": sums, "fields": list(contract.TELEMETRY_ROW), "recent": recent}, separators=(",", ":")))
    run_dir = work / "top64"

    def refresh() -> None:
        top.text(top.snapshot(run_dir))

    def parse_only() -> None:
        for path in sorted(directory.glob("rank-*.json")):
            json.loads(path.read_bytes())
    full = min(timeit.repeat(refresh, number=5, repeat=5)) / 5
    raw = min(timeit.repeat(parse_only, number=5, repeat=5)) / 5
    rows.append(("16", f"`top` refresh over 64 ranks x {KEEP} steps (read, straggler verdict, table) / json.loads only",
                 f"{full * 1000:.1f} ms / {raw * 1000:.1f} ms = {full / raw:.1f}x", "< 50 ms per refresh"))
