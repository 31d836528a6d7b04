"""Bench item 17 (issue 55): what peer heal costs a step with no fault: each optimizer step sends the rank's random
states (~12 KB) to its buddy on the next node and receives one. bench/peer_step.py on 2 emulated nodes x 2 ranks
(the local backend), peer heal on and off alternating, RUNS times each, at two model sizes: a tiny MLP (steps of a
few ms: the worst case) and a wider one. The ratio is of medians measured in the same run. On a machine with fewer
cores than ranks the difference of step times also holds the other ranks' extra work (they share the cores), so the
keeper's own hooks are timed inside the job as well (CPU time, by hooks registered before and after its own)."""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import List, Tuple

ROOT = Path(__file__).resolve().parent.parent
RUNS, STEPS = 3, 300


def _median_step(work: Path, width: int, peer: bool, n: int) -> Tuple[float, float]:
    out = work / f"peer-{width}-{int(peer)}-{n}.json"
    argv = [sys.executable, "-m", "clusterddp", "submit", "--local", "--launcher", "srun", "--nodes", "2",
            "--procs-per-node", "2", *([] if peer else ["--no-peer-heal"]), str(ROOT / "bench" / "peer_step.py"),
            "--", "--width", str(width), "--steps", str(STEPS), "--out", str(out)]
    subprocess.run(argv, cwd=work, check=True, capture_output=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    result = json.loads(out.read_text())
    if result["kept"] != peer:
        raise RuntimeError(f"peer heal {'on' if peer else 'off'} asked, the keeping ran: {result['kept']}")
    return float(result["median_s"]), float(result["hooks_s"])


def rows(work: Path) -> List[Tuple[str, str, str, str]]:
    out = []
    for width in (64, 1024):
        times: dict = {True: [], False: []}
        hooks: dict = {True: [], False: []}
        for n in range(RUNS):
            for peer in (True, False):
                step, hook = _median_step(work, width, peer, n)
                times[peer].append(step)
                hooks[peer].append(hook)
        on, off = statistics.median(times[True]), statistics.median(times[False])
        own = statistics.median(hooks[True]) - statistics.median(hooks[False])  # less the timing hooks' own
        out.append(("17", f"step time with peer heal on / off, no fault: MLP of width {width}, 4 ranks on 2 emulated "
                          f"nodes (gloo, CPU), median step of {STEPS}, median of {RUNS} runs each",
                    f"{on * 1e3:.2f} ms / {off * 1e3:.2f} ms = {on / off:.3f}x", "<= 1.01x"))
        out.append(("17", "peer heal's own work in a step (its optimizer hooks' CPU time, timed inside the job), "
                          f"width {width}: median / the step with it off",
                    f"{own * 1e6:.0f} us / {off * 1e3:.2f} ms = {1 + own / off:.4f}x", "<= 1.01x"))
    return out


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory(prefix="clusterddp-bench-") as tmp:
        for row in rows(Path(tmp)):
            print(f"| {' | '.join(row)} |")
