"""Where did the node-hours go: a job's goodput ledger from its allocations, attempts and their step telemetry.
Login side.

The whole is what Slurm allocated: each allocation's nodes (spares and excluded nodes included) from its start to its
end (``allocations.tsv``). Each attempt (``attempts.tsv``: nodes, start, end, exit code) is split on its own
timeline: start-up (the allocation's start to the attempt's first step), steps (first step to the last one
recorded), then the end: the watchdog's wait for a hang, a failed attempt's last moments, or a finished one's tail
(saving, leaving, the allocation's end). The steps are split again into productive ones, steps redone (run again
after a resume: the checkpoint it resumed from was behind the previous attempt's last step) and checkpoint saves
training waited for. Between two attempts in one allocation the retry's health gate runs; nodes of the allocation an
attempt does not use (a spare, an excluded node) are idle. Every part is node-seconds, so the parts add up to the
allocations by construction. A job without allocation records (older runs) is its attempts' spans; the queue between
requeues is not an allocation and not in it.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

from .. import contract
from ..healing import attempts as attempts_file
from . import telemetry

PARTS = ("productive", "start-up", "redone", "checkpoint", "hang", "failed", "gate", "idle", "tail")


@dataclass
class Ledger:
    """Node-seconds by part, and the steps behind them."""

    parts: Dict[str, float] = field(default_factory=lambda: dict.fromkeys(PARTS, 0.0))
    steps: int = 0          # steps run, redone ones included
    redone_steps: int = 0
    attempts: int = 0
    unmeasured: int = 0     # attempts that ended well with no step recorded (telemetry off, no runtime steps)

    @property
    def total(self) -> float:
        return sum(self.parts.values())

    @property
    def goodput(self) -> float:
        return self.parts["productive"] / self.total if self.total > 0 else 0.0

    def line(self) -> str:
        """'goodput 91%: 3.2 of 3.5 node-hours trained; lost: start-up 4%, redone 2%'."""
        total = self.total
        if total <= 0:
            return "goodput: nothing recorded yet"
        if self.unmeasured and self.parts["productive"] <= 0:
            return (f"goodput not measured: no step was recorded ({contract.TELEMETRY}=0, or a loop that calls "
                    f"neither runtime.step() nor runtime.should_stop()); {self._amount(total)} allocated")
        scale, unit = (3600.0, "node-hours") if total >= 3600 else (60.0, "node-minutes") if total >= 60 else \
            (1.0, "node-seconds")
        lost = [f"{name} {100 * v / total:.0f}%" for name, v in self.parts.items()
                if name != "productive" and v / total >= 0.005]
        redone = f" ({self.redone_steps} of {self.steps} steps redone)" if self.redone_steps else ""
        return (f"goodput {100 * self.goodput:.0f}%: {self.parts['productive'] / scale:.3g} of {total / scale:.3g} "
                f"{unit} trained; lost: {', '.join(lost) or 'nothing'}{redone}")

    @staticmethod
    def _amount(total: float) -> str:
        scale, unit = (3600.0, "node-hours") if total >= 3600 else (60.0, "node-minutes") if total >= 60 else \
            (1.0, "node-seconds")
        return f"{total / scale:.3g} {unit}"

    def add(self, other: "Ledger") -> None:
        """Another job's ledger into this one (a sweep's trials)."""
        for name, value in other.parts.items():
            self.parts[name] += value
        self.steps += other.steps
        self.redone_steps += other.redone_steps
        self.attempts += other.attempts
        self.unmeasured += other.unmeasured

    def as_json(self) -> Dict[str, object]:
        return {"goodput": round(self.goodput, 4), "total_node_s": round(self.total, 3),
                "parts_node_s": {k: round(v, 3) for k, v in self.parts.items()}, "steps": self.steps,
                "redone_steps": self.redone_steps, "attempts": self.attempts}


def _telemetry_of(run_dir: Path, a: attempts_file.Attempt, last_of_restart: bool) -> Optional[Path]:
    """An attempt's telemetry directory: set aside with its logs when it was retried, else in the run directory."""
    aside = Path(run_dir) / contract.ATTEMPT_DIR.format(restarts=a.restart, attempt=a.attempt)
    if telemetry.attempt_dir(aside, a.restart).is_dir():
        return aside
    return Path(run_dir) if last_of_restart else None


def ledger(run_dir: Path) -> Optional[Ledger]:
    """The job's ledger from its ended attempts (None: none ended yet, or none recorded)."""
    done = sorted(attempts_file.read(run_dir), key=lambda a: (a.restart, a.attempt))
    held_by = {alloc.restart: alloc for alloc in attempts_file.allocations(run_dir)}
    # an allocation that ended with no attempt recorded (its script ended before one: a setup line, the gate, a
    # node lost at start) is lost whole; left out, the ledger showed less than Slurm allocated
    empty = [a for r, a in held_by.items() if a.end and r not in {d.restart for d in done}]
    if not done and not empty:
        return None
    out = Ledger(attempts=len(done))
    for lost in empty:
        out.parts["failed"] += max(0.0, lost.end - lost.start) * max(1, len(lost.nodes))
    reached = 0  # the furthest step any earlier attempt recorded
    cursor = 0.0  # one timeline per allocation that never goes back (attempts' times are whole seconds)
    for i, a in enumerate(done):
        nodes = max(1, len(a.nodes))
        alloc = held_by.get(a.restart)
        held = max(nodes, len(alloc.nodes)) if alloc is not None else nodes
        opens = i == 0 or done[i - 1].restart != a.restart
        later = done[i + 1] if i + 1 < len(done) else None
        if opens:
            cursor = alloc.start if alloc is not None else float(a.start)
        start = max(cursor, float(a.start))
        end = max(start, float(a.end))
        if alloc is not None and alloc.end:
            end = min(end, max(start, alloc.end))
        out.parts["start-up" if opens else "gate"] += (start - cursor) * held
        out.parts["idle"] += (end - start) * (held - nodes)
        cursor = end
        ending = "tail" if a.exit == 0 else "hang" if a.exit == contract.HANG_EXIT else "failed"
        if (later is None or later.restart != a.restart) and alloc is not None and alloc.end:
            out.parts[ending] += max(0.0, alloc.end - end) * held
        where = _telemetry_of(run_dir, a, later is None or later.restart != a.restart)
        ranks = telemetry.read(where, a.restart) if where is not None else []
        pos = telemetry.positions(telemetry.attempt_dir(where, a.restart)) if where is not None else {}
        firsts = [r.first for r in ranks if r.first is not None]
        if not firsts or not pos:
            out.parts["failed" if a.exit != 0 else "start-up"] += (end - start) * nodes
            out.unmeasured += a.exit == 0
            continue
        first = min(max(min(firsts), start), end)
        last = min(max(max(t for _, t in pos.values()), first), end)
        position = max(p for p, _ in pos.values())
        bases = [r.base for r in ranks]
        base = max(bases) if min(bases) >= 0 else 0
        ran = max(0, position - base)
        redone = max(0, min(reached, position) - base) if min(bases) >= 0 else 0
        reached = max(reached, position)
        span = last - first
        shares = [r.sums["ckpt"] / r.sums["total"] for r in ranks if r.sums["total"] > 0]
        ckpt = span * min(1.0, statistics.median(shares)) if shares else 0.0
        redo = (span - ckpt) * redone / ran if ran else 0.0
        out.parts["start-up"] += (first - start) * nodes
        out.parts["checkpoint"] += ckpt * nodes
        out.parts["redone"] += redo * nodes
        out.parts["productive"] += (span - ckpt - redo) * nodes
        out.parts[ending] += (end - last) * nodes
        out.steps += ran
        out.redone_steps += redone
    return out


def lines(run_dir: Path) -> List[str]:
    """The ledger's line, or none when there is nothing to say."""
    found = ledger(run_dir)
    return [found.line()] if found is not None and found.total > 0 else []
