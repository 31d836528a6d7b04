"""``clusterddp top``: how fast is each rank, and why: a table from the ranks' step telemetry. Login side.

A job id finds its run directory through the job's record (on a remote cluster the table is made on its login
node, where the files are, by this module run there); a run directory of a --local run is read directly.
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .. import contract
from ..contract import EXIT
from ..errors import ClusterDDPError
from ..rollcall import printable
from . import telemetry

MODULE = "clusterddp.observe.top"


def snapshot(run_dir: Path, restart: Optional[int] = None, now: Optional[float] = None) -> Dict[str, Any]:
    """The table's data: per rank, the straggler verdict, and what is missing (for ``--json`` and the text)."""
    ranks = telemetry.read(run_dir, restart)
    now = time.time() if now is None else now
    table = telemetry.rank_table(ranks)
    for row, r in zip(table, ranks):
        row["age_s"] = round(max(0.0, now - r.written), 1)
    found = telemetry.stragglers(ranks)
    snap: Dict[str, Any] = {"run_dir": str(run_dir), "restart": ranks[0].restart if ranks else None,
                            "ranks": table, "nodes": sorted({r.node for r in ranks}),
                            "stragglers": [asdict(s) for s in found],
                            "straggler_line": telemetry.straggler_text(ranks, found) if ranks else "",
                            "missing": "" if ranks else missing(run_dir)}
    return snap


def missing(run_dir: Path) -> str:
    """One line: why there is no telemetry to show."""
    return (f"no step telemetry in {run_dir}: the job has not ended a step yet, its script never calls "
            "runtime.should_stop() or runtime.step() once per step (clusterddp.runtime records steps there), or "
            f"{contract.TELEMETRY}=0 turned it off")


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 10 else f"{seconds:.1f} s"


def text(snap: Dict[str, Any]) -> str:
    """The table for people."""
    if not snap["ranks"]:
        return snap["missing"]
    ranks = snap["ranks"]
    head = (f"{snap['run_dir']}: attempt of restart {snap['restart']}, {len(ranks)} ranks on "
            f"{len(snap['nodes'])} node(s); comm = waiting in the gradient all-reduce and the stop agreement")
    cols = ["NODE", "RANK", "STEPS", "STEPS/S", "P50", "P95", "DATA%", "COMPUTE%", "COMM%", "OPT%", "CKPT%", "AGE"]
    rows = [[r["node"], str(r["rank"]), str(r["steps"]),
             f"{r['steps_per_s']:.2f}" if r["steps_per_s"] is not None else "-",
             _ms(r["step_p50_s"]), _ms(r["step_p95_s"]), f"{r['data_pct']:.1f}", f"{r['compute_pct']:.1f}",
             f"{r['comm_pct']:.1f}", f"{r['opt_pct']:.1f}", f"{r['ckpt_pct']:.1f}", f"{r['age_s']:.0f} s"]
            for r in sorted(ranks, key=lambda r: (r["node"], r["rank"]))]
    if any(r.get("gpu_mem_mb") is not None for r in ranks):  # where CUDA was used: utilisation (NVML) and memory
        cols += ["GPU%", "GPU MEM"]
        for row, r in zip(rows, sorted(ranks, key=lambda r: (r["node"], r["rank"]))):
            row += ["-" if r.get("gpu_util_pct") is None else str(r["gpu_util_pct"]),
                    "-" if r.get("gpu_mem_mb") is None else f"{r['gpu_mem_mb'] / 1024:.1f}/"
                    f"{(r.get('gpu_total_mb') or 0) / 1024:.0f} GiB"]
    widths = [max(len(c) for c in column) for column in zip(cols, *rows)]
    lines = [head, "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cols, widths)))]
    lines += ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
              for row in rows]
    return "\n".join(lines + [snap["straggler_line"]])


def where(job: str, cluster_option: Optional[str], command: str,
          note: Callable[[str], None]) -> Tuple[Path, Any, Optional[str], Any]:
    """``top JOB`` and ``report JOB``: the run directory, the backend and the job id and record (None, None and
    None for a run directory given)."""
    from .. import backends
    from ..backends.record import locate

    job_id, run_dir, record, chosen = locate(job, cluster_option, command,
                                             note=lambda line: note(f"clusterddp: {line}"))
    return run_dir, (backends.get(chosen) if chosen is not None else None), job_id, record


def remote_snapshot(backend: Any, python: str, run_dir: Path) -> Dict[str, Any]:
    """The snapshot made on a remote cluster's login node (this module, run there with the job's Python)."""
    from .stacks import module_answer

    answer, wrong = module_answer(backend, python, MODULE, [str(run_dir)], 60, "top")
    if not isinstance(answer.get("ranks"), list):
        raise wrong
    return _checked(answer)


def _checked(answer: Dict[str, Any]) -> Dict[str, Any]:
    """A remote answer is data: text fields made printable, rows kept only with the fields the table reads."""
    keys = ("rank", "node", "steps", "steps_per_s", "step_p50_s", "step_p95_s", "age_s") + tuple(
        f"{p}_pct" for p in contract.TELEMETRY_PHASES)
    for r in answer["ranks"]:  # optional numbers: kept only as numbers
        for k in ("gpu_util_pct", "gpu_mem_mb", "gpu_total_mb"):
            if isinstance(r, dict) and not isinstance(r.get(k), int):
                r[k] = None
    rows = [r for r in answer["ranks"] if isinstance(r, dict) and all(k in r for k in keys)]
    for r in rows:
        r["node"] = printable(str(r["node"]))[:64]
        if not all(isinstance(r[k], (int, float)) or (k == "steps_per_s" and r[k] is None) for k in keys[2:]):
            raise ClusterDDPError("clusterddp top: a remote answer held something other than numbers")
    return {"run_dir": printable(str(answer.get("run_dir", "")))[:500], "restart": answer.get("restart"),
            "ranks": rows, "nodes": sorted({r["node"] for r in rows}), "stragglers": answer.get("stragglers", []),
            "straggler_line": printable(str(answer.get("straggler_line", "")))[:2000],
            "missing": printable(str(answer.get("missing", "")))[:500]}


def follow(get: Callable[[], Dict[str, Any]], show: Callable[[str], None], once: bool, interval: float,
           running: Callable[[], bool]) -> Dict[str, Any]:
    """Show the table, then again every ``interval`` seconds in place while ``running()`` (``once``: one)."""
    snap = get()
    show(text(snap))
    while not once and running():
        time.sleep(interval)
        snap = get()
        show("\033[H\033[2J" + text(snap))
    return snap


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m clusterddp.observe.top RUN_DIR``: the snapshot as JSON where the files are."""
    args: List[str] = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print(json.dumps({"error": "usage: python -m clusterddp.observe.top RUN_DIR"}))
        return EXIT["USAGE"]
    print(json.dumps(snapshot(Path(args[0]))))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
