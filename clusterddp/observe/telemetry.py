"""The ranks' step telemetry, read as data (login side; pure over files): per-rank numbers and the straggler.

Files: ``contract.TELEMETRY_FILE`` in the run directory, one per rank and attempt, written by the ranks' control
threads (runtime/telemetry.py). Everything in them is checked before use: a file someone else wrote, or one cut
short, is skipped, never trusted.
"""
from __future__ import annotations

import bisect
import math
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .. import contract
from ..datafiles import parse_json, read_bounded

WINDOW = 40            # steps the numbers and the straggler verdict look at
SLOWER = 0.20          # a rank's step is slow when its phase is this much above the others' median ...
MIN_EXCESS_S = 0.002   # ... and by at least this much (clock noise on tiny steps is not slowness)
# A straggler costs the job at least LOST of its time (the sum of its excess in its slow steps: in DDP every rank
# waits that long for it). 10%: a cost worth acting on (a node drained, a loader fixed), and well above what
# ordinary jitter adds up to for one rank of an even run (at most 2% in even 4-rank jobs on 2 busy shared cores;
# on a machine loaded past its cores one rank of 20-ms steps was 12% slow, the machine's doing, which it reports).
LOST = 0.10
MIN_SLOW_STEPS = 3     # ... in at least this many steps: one hiccup (a GC pause, a page fault) is no straggler
PERSISTENT = 0.75      # slow in this share of the steps: said to be persistently slow, else intermittently
_MAX_FILE = 1 << 20
_ROWS = 64            # recent steps read per rank: the window and room for files written a moment apart
_RESTART_DIR = re.compile(r"restart-([0-9]{1,6})")
_RANK_FILE = re.compile(r"rank-([0-9]{1,7})\.json")
Row = Tuple[float, ...]  # contract.TELEMETRY_ROW
_NUMBERS = {int, float}


@dataclass(frozen=True)
class RankSteps:
    """One rank's file: who, where, how many steps, and the recent ones."""

    rank: int
    node: str
    restart: int
    steps: int                       # steps this attempt ended
    base: int                        # steps done before it (resumed from a checkpoint); -1: unknown
    first: Optional[float]           # Unix time its first step began
    written: float                   # Unix time of the file
    sums: Dict[str, float]
    recent: List[Row] = field(default_factory=list)
    gpu: Dict[str, int] = field(default_factory=dict)  # util (%), mem_mb (peak), total_mb: where CUDA was used

    def column(self, name: str, rows: Sequence[Row]) -> List[float]:
        i = contract.TELEMETRY_ROW.index(name)
        return [r[i] for r in rows]


def _number(value: Any) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) and 0 <= value < 1e11 else None


def parse(raw: bytes, keep: int = _ROWS) -> Optional[RankSteps]:
    """One rank's file, or None when it is not one (damaged, of another shape, out of range); its last ``keep``
    steps."""
    try:
        data = parse_json(raw)
    except ValueError:
        return None
    if not isinstance(data, dict) or data.get("version") != 1:
        return None
    ints = [data.get(k) for k in ("rank", "restart", "steps", "base")]
    if not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 10**9 for v in ints):
        return None
    rank, restart, steps, base = (int(v) for v in ints)  # type: ignore[arg-type]
    written = _number(data.get("written"))
    first = _number(data.get("first")) if data.get("first") is not None else None
    sums_in: Dict[str, Any] = data["sums"] if isinstance(data.get("sums"), dict) else {}
    sums = {k: _number(sums_in.get(k)) for k in contract.TELEMETRY_ROW[2:]}
    rows_in: List[Any] = data["recent"] if isinstance(data.get("recent"), list) else []
    rows: List[Row] = []
    width = len(contract.TELEMETRY_ROW)
    for row in rows_in[-keep:]:  # (the hot loop of a refresh: 64 ranks x 256 rows; type() leaves bools out)
        if type(row) is list and len(row) == width and set(map(type, row)) <= _NUMBERS:
            values = tuple(map(float, row))
            if math.isfinite(sum(values)) and min(values) >= 0 and max(values) < 1e11:
                rows.append(values)
    if written is None or any(v is None for v in sums.values()):
        return None
    node = re.sub(r"[^A-Za-z0-9._-]", "?", str(data.get("node", "?")))[:64] or "?"  # one word, whatever it held
    gpu_in: Dict[str, Any] = data["gpu"] if isinstance(data.get("gpu"), dict) else {}
    gpu = {k: int(v) for k, v in gpu_in.items() if k in ("util", "mem_mb", "total_mb") and type(v) is int
           and 0 <= v < 1 << 40}
    return RankSteps(rank, node, restart, steps, base if data.get("based") is not False else -1, first, written,
                     {k: v for k, v in sums.items() if v is not None}, rows, gpu)


def restarts(run_dir: Path) -> List[int]:
    """The attempts (Slurm restart counts) that wrote telemetry, oldest first."""
    try:
        names = [p.name for p in (Path(run_dir) / "telemetry").iterdir()]
    except OSError:
        return []
    return sorted(int(m.group(1)) for m in map(_RESTART_DIR.fullmatch, names) if m)


def read(run_dir: Path, restart: Optional[int] = None, keep: int = _ROWS) -> List[RankSteps]:
    """Every rank's file of one attempt (the newest when ``restart`` is None), by rank."""
    if restart is None:
        found = restarts(run_dir)
        if not found:
            return []
        restart = found[-1]
    directory = attempt_dir(run_dir, restart)
    out: Dict[int, RankSteps] = {}
    try:
        names = sorted(p.name for p in directory.iterdir())[:1 << 16]
    except OSError:
        return []
    for name in names:
        m = _RANK_FILE.fullmatch(name)
        raw = read_bounded(directory / name, _MAX_FILE) if m else None
        parsed = parse(raw, keep) if raw is not None else None
        if parsed is not None and m and parsed.rank == int(m.group(1)) and parsed.restart == restart:
            out[parsed.rank] = parsed
    return [out[r] for r in sorted(out)]


_POS = re.compile(rb"([0-9]{12}) ([0-9]{13}\.[0-9]{3})\n")


def positions(directory: Path) -> Dict[int, Tuple[int, float]]:
    """Each rank's position file in an attempt's telemetry directory: rank -> (steps done, Unix time)."""
    out: Dict[int, Tuple[int, float]] = {}
    try:
        names = sorted(p.name for p in Path(directory).iterdir())[:1 << 16]
    except OSError:
        return out
    for name in names:
        m = re.fullmatch(r"rank-([0-9]{1,7})\.pos", name)
        raw = read_bounded(Path(directory) / name, 64) if m else None
        found = _POS.fullmatch(raw) if raw is not None else None
        if m and found:
            out[int(m.group(1))] = (int(found.group(1)), float(found.group(2)))
    return out


def attempt_dir(run_dir: Path, restart: int) -> Path:
    """Where one attempt's telemetry files are, below a run directory (or an attempt's set-aside directory)."""
    return Path(run_dir) / contract.TELEMETRY_FILE.format(restarts=restart, rank=0).rsplit("/", 1)[0]


def _share(values: Sequence[float], totals: Sequence[float]) -> float:
    total = sum(totals)
    return sum(values) / total if total > 0 else 0.0


def _pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return 0.0
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def rank_table(ranks: Sequence[RankSteps], window: int = WINDOW) -> List[Dict[str, Any]]:
    """Per rank over its last ``window`` steps: steps/s, step time p50/p95, and each phase's share of the time."""
    out = []
    for r in ranks:
        rows = r.recent[-window:]
        totals = r.column("total", rows)
        span = (rows[-1][1] - rows[0][1]) if len(rows) > 1 else 0.0
        entry: Dict[str, Any] = {
            "rank": r.rank, "node": r.node, "steps": r.base + r.steps if r.base >= 0 else r.steps,
            "steps_per_s": round((len(rows) - 1) / span, 3) if span > 0 else None,
            "step_p50_s": round(_pct(totals, 0.5), 6), "step_p95_s": round(_pct(totals, 0.95), 6),
            "age_s": None, "gpu_util_pct": r.gpu.get("util"), "gpu_mem_mb": r.gpu.get("mem_mb"),
            "gpu_total_mb": r.gpu.get("total_mb")}
        for phase in contract.TELEMETRY_PHASES:
            entry[f"{phase}_pct"] = round(100 * _share(r.column(phase, rows), totals), 1)
        out.append(entry)
    return out


@dataclass(frozen=True)
class Straggler:
    rank: int
    node: str
    phase: str            # compute | data
    slower_pct: float     # its phase time above the others' median in its slow steps (the median of them)
    others_wait_pct: float  # the other ranks' waiting (all-reduce, stop agreement): % of their time in the window
    steps: int            # the window it was judged over
    lost_pct: float = 0.0   # the job's time lost to it: % of the window's time
    slow_steps: int = 0     # the steps it was slow in
    excess_s: float = 0.0   # by how much, at the median of its slow steps

    def line(self, world_size: int) -> str:
        what = {"compute": "its compute", "data": "its wait for data"}[self.phase]
        how = f"{self.slower_pct:.0f}% longer" if self.slower_pct < 200 else \
            f"{1 + self.slower_pct / 100:.0f} times as long"
        spread = "persistently" if self.slow_steps >= PERSISTENT * self.steps else "intermittently"
        by = f"{self.excess_s * 1000:.0f} ms" if self.excess_s < 1 else f"{self.excess_s:.2f} s"
        return (f"rank {self.rank} ({self.node}) costs the job {self.lost_pct:.0f}% of its time over the last "
                f"{self.steps} steps ({self.phase}): {what} ran over the others' median in {self.slow_steps} of "
                f"them ({spread}), by {by} at the median ({how}); the other {world_size - 1} ranks wait "
                f"{self.others_wait_pct:.0f}% of their time")


def _median_without(ordered: Sequence[float], value: float) -> float:
    """The median of ``ordered`` (sorted) with one occurrence of ``value`` left out: O(log n)."""
    pos = bisect.bisect_left(ordered, value)

    def at(i: int) -> float:
        return ordered[i] if i < pos else ordered[i + 1]
    m = len(ordered) - 1
    return at(m // 2) if m % 2 else (at(m // 2 - 1) + at(m // 2)) / 2


def _slow(column: Sequence[Sequence[float]], ordered: Sequence[Sequence[float]],
          i: int) -> List[Tuple[int, float, float]]:
    """Rank ``i``'s slow steps in one phase ([step][rank] values, each step's sorted): (step, its excess over the
    others' median, its ratio to it)."""
    out = []
    for j, values in enumerate(column):
        value = values[i]
        median = _median_without(ordered[j], value)
        if value > median * (1 + SLOWER) and value - median >= MIN_EXCESS_S:
            out.append((j, value - median, value / median if median > 0 else math.inf))
    return out


def stragglers(ranks: Sequence[RankSteps], window: int = WINDOW) -> List[Straggler]:
    """The ranks that hold the others back, by the time they cost: over the steps every rank recorded (the last
    ``window``), a rank whose compute or data time ran above the others' median (by SLOWER and MIN_EXCESS_S) in at
    least MIN_SLOW_STEPS steps, by LOST of the job's time in all (each step's time: the mean over the ranks), while
    the others wait for it in those steps (all-reduce, stop agreement) at least half of that. In DDP everyone's step
    takes as long as the slowest rank's: the straggler is the one that waits least; slower, but with no one waiting
    for it, it holds no one back."""
    if len(ranks) < 2:
        return []
    by_rank = [{int(row[0]): row for row in r.recent} for r in ranks]
    common = sorted(set.intersection(*(set(steps) for steps in by_rank)))[-window:]
    if len(common) < min(window, 10):
        return []
    idx = contract.TELEMETRY_ROW.index
    rows = [[steps[s] for s in common] for steps in by_rank]  # [rank][step] -> row
    n, wait_sum = len(ranks), [sum(row[idx("comm")] for row in mine) for mine in rows]
    total_sum = [sum(row[idx("total")] for row in mine) for mine in rows]
    job_time = sum(total_sum) / n  # the sum over steps of the mean over ranks
    found = []
    for phase in ("compute", "data"):
        column = [[mine[j][idx(phase)] for mine in rows] for j in range(len(common))]  # [step][rank]
        ordered = [sorted(values) for values in column]
        for i, r in enumerate(ranks):
            slow = _slow(column, ordered, i)
            lost = sum(excess for _, excess, _ in slow)
            if len(slow) < MIN_SLOW_STEPS or job_time <= 0 or lost < LOST * job_time:
                continue
            waited = sum(sum(rows[k][j][idx("comm")] for k in range(n) if k != i) for j, _, _ in slow) / (n - 1)
            if waited < 0.5 * lost:
                continue  # the others do not wait for it: slower, but holding no one back
            ratio = statistics.median(ratio for _, _, ratio in slow)
            others = sum(total_sum) - total_sum[i]
            found.append(Straggler(
                r.rank, r.node, phase, round(100 * (ratio - 1), 1) if math.isfinite(ratio) else 999.0,
                round(100 * (sum(wait_sum) - wait_sum[i]) / others, 1) if others > 0 else 0.0, len(common),
                round(100 * lost / job_time, 1), len(slow), round(statistics.median(e for _, e, _ in slow), 6)))
    return sorted(found, key=lambda f: (f.rank, f.phase))


def straggler_text(ranks: Sequence[RankSteps], found: Sequence[Straggler]) -> str:
    """The straggler line: who, or 'none' (or why it cannot be told yet)."""
    if len(ranks) < 2:
        return "stragglers: none (one rank)"
    if not found:
        common = set.intersection(*({int(row[0]) for row in r.recent} for r in ranks))
        if len(common) < min(WINDOW, 10):
            return f"stragglers: not known yet ({len(common)} steps recorded by every rank; 10 needed)"
        return f"stragglers: none over the last {min(WINDOW, len(common))} steps"
    return "stragglers: " + "; ".join(s.line(len(ranks)) for s in found)
