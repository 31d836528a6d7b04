"""``clusterddp report``: a job's story in one self-contained HTML file (plots embedded, viewable with no network)
and a terminal summary. Login side; matplotlib is imported only here, on use (``pip install 'clusterddp[report]'``).

Plots: step time per rank over the job (every attempt), where each rank's time goes, the attempts' timeline with
their faults, the goodput ledger, and the metrics the script recorded with ``runtime.report`` (loss curves).
"""
from __future__ import annotations

import base64
import html
import io
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from .. import contract
from ..errors import ClusterDDPError
from ..healing import attempts as attempts_file
from . import goodput, metrics, telemetry

REPORT_FILE = "report.html"
_KEEP = 1 << 12
_COLOURS = {"data": "#9467bd", "compute": "#1f77b4", "comm": "#ff7f0e", "opt": "#2ca02c", "ckpt": "#8c564b"}
_PART_COLOURS = {"productive": "#2ca02c", "start-up": "#7f7f7f", "redone": "#d62728", "checkpoint": "#8c564b",
                 "hang": "#e377c2", "failed": "#ff7f0e", "gate": "#bcbd22", "idle": "#c7c7c7",
                 "tail": "#17becf"}


@dataclass
class Story:
    """What the report shows, read from the run directory."""

    run_dir: Path
    attempts: List[attempts_file.Attempt] = field(default_factory=list)
    steps: List[Tuple[str, List[telemetry.RankSteps]]] = field(default_factory=list)  # (attempt label, ranks)
    ledger: Optional[goodput.Ledger] = None
    metrics: List[Tuple[Optional[int], Dict[str, float]]] = field(default_factory=list)
    stragglers: str = ""

    def missing(self) -> List[str]:
        out = []
        if not self.steps:
            out.append("step telemetry (the script never ended a step: runtime.should_stop() or runtime.step() once "
                       f"per step; or {contract.TELEMETRY}=0)")
        if not self.attempts:
            out.append("attempts (the job has not ended an attempt yet)")
        if not self.metrics:
            out.append("metrics (runtime.report(step=..., loss=...) records them)")
        return out


def gather(run_dir: Path) -> Story:
    """Everything the report shows: every attempt's telemetry (set aside with a retried attempt's logs, or in the
    run directory), the ledger, the metrics."""
    story = Story(Path(run_dir), attempts=sorted(attempts_file.read(run_dir), key=lambda a: (a.restart, a.attempt)))
    seen = set()
    for a in story.attempts:
        aside = Path(run_dir) / contract.ATTEMPT_DIR.format(restarts=a.restart, attempt=a.attempt)
        ranks = telemetry.read(aside, a.restart, keep=_KEEP)
        if ranks:
            story.steps.append((f"attempt {a.attempt + 1} (restart {a.restart})", ranks))
    for restart in telemetry.restarts(run_dir):  # the last attempt of each restart, and one still running
        ranks = telemetry.read(run_dir, restart, keep=_KEEP)
        if ranks and restart not in seen:
            seen.add(restart)
            last = [a for a in story.attempts if a.restart == restart]
            label = f"attempt {last[-1].attempt + 1} (restart {restart})" if last else f"restart {restart}"
            if not any(label == have for have, _ in story.steps):
                story.steps.append((label, ranks))
    story.ledger = goodput.ledger(run_dir)
    story.metrics = metrics.read(Path(run_dir))
    if story.steps:
        ranks = story.steps[-1][1]
        story.stragglers = telemetry.straggler_text(ranks, telemetry.stragglers(ranks))
    return story


def summary(story: Story) -> str:
    """The terminal summary: attempts, goodput, stragglers, the last metrics, and what is missing."""
    lines = attempts_file.lines(story.run_dir, story.attempts)
    if story.ledger is not None and story.ledger.total > 0:
        lines.append(story.ledger.line())
    if story.stragglers:
        lines.append(story.stragglers)
    if story.steps:
        table = telemetry.rank_table(story.steps[-1][1])
        p50 = statistics.median(r["step_p50_s"] for r in table)
        lines.append(f"{len(table)} ranks, median step {p50 * 1000:.0f} ms; of each step (median over ranks): "
                     + ", ".join(f"{p} {statistics.median(r[f'{p}_pct'] for r in table):.0f}%"
                                 for p in contract.TELEMETRY_PHASES))
    last = {k: (step, v) for step, values in story.metrics for k, v in values.items()}
    if last:
        lines.append("last metrics: " + ", ".join(f"{k} {v:.4g}" + (f" (step {s})" if s is not None else "")
                                                  for k, (s, v) in sorted(last.items())[:8]))
    return "\n".join(lines)


def _png(fig: Any) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
    return base64.b64encode(buffer.getvalue()).decode()


def figures(story: Story) -> List[Tuple[str, str]]:
    """(title, base64 PNG) per plot there is data for."""
    try:
        import matplotlib
    except ImportError:
        raise ClusterDDPError("clusterddp report draws its plots with matplotlib, which is not installed here: "
                              "pip install 'clusterddp[report]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0 = min([a.start for a in story.attempts] + [r.recent[0][1] for _, ranks in story.steps for r in ranks
                                                   if r.recent] or [0])
    out: List[Tuple[str, str]] = []
    for title, draw in (("Compute per rank", _compute), ("Where each rank's time goes", _phases),
                        ("Attempts", _attempts), ("Goodput", _goodput), ("Metrics (runtime.report)", _metrics)):
        fig = draw(plt, story, t0)
        if fig is not None:
            out.append((title, _png(fig)))
            plt.close(fig)
    return out


def compute_series(story: Story, t0: float) -> List[Tuple[str, List[Tuple[float, float]]]]:
    """Per rank of each attempt: (seconds since t0, compute ms) per recorded step. Compute, not step time: under DDP
    every rank's step lasts as long as the slowest's, so only compute (or data) shows which rank is slow."""
    i = contract.TELEMETRY_ROW.index("compute")
    return [(f"rank {r.rank} ({r.node})" if label == story.steps[-1][0] else "",
             [(row[1] - t0, row[i] * 1000) for row in r.recent]) for label, ranks in story.steps for r in ranks]


def _compute(plt: Any, story: Story, t0: float) -> Any:
    if not story.steps:
        return None
    fig, ax = plt.subplots(figsize=(10, 3.6))
    few = len(story.steps[-1][1]) <= 16
    for label, points in compute_series(story, t0):
        ax.plot([t for t, _ in points], [ms for _, ms in points], lw=1, label=label if label and few else None)
    ax.set_xlabel("seconds since the job's first attempt began")
    ax.set_ylabel("compute per step (ms)")
    if few:
        ax.legend(fontsize=7, ncol=4)
    return fig


def _phases(plt: Any, story: Story, t0: float) -> Any:
    if not story.steps:
        return None
    ranks = story.steps[-1][1]
    fig, ax = plt.subplots(figsize=(10, 0.5 + 0.3 * len(ranks)))
    left = [0.0] * len(ranks)
    for phase in contract.TELEMETRY_PHASES:
        share = [100 * r.sums[phase] / r.sums["total"] if r.sums["total"] > 0 else 0 for r in ranks]
        ax.barh([f"rank {r.rank} ({r.node})" for r in ranks], share, left=left, color=_COLOURS[phase],
                label=phase)
        left = [a + b for a, b in zip(left, share)]
    ax.set_xlabel(f"% of the step ({story.steps[-1][0]})")
    ax.legend(fontsize=7, ncol=5, loc="lower right")
    return fig


def _attempts(plt: Any, story: Story, t0: float) -> Any:
    if not story.attempts:
        return None
    fig, ax = plt.subplots(figsize=(10, 0.8 + 0.4 * len(story.attempts)))
    for i, a in enumerate(story.attempts):
        colour = "#2ca02c" if a.exit == 0 else "#d62728" if a.fault else "#7f7f7f"
        ax.barh(i, max(1, a.end - a.start), left=a.start - t0, color=colour)
        ax.text(a.end - t0, i, f"  {','.join(a.nodes)}: exit {a.exit}" + (f", {a.fault}" if a.fault else ""),
                va="center", fontsize=7)
    ax.set_yticks(range(len(story.attempts)), [f"attempt {a.attempt + 1} (restart {a.restart})"
                                              for a in story.attempts])
    ax.set_xlabel("seconds since the job's first attempt began")
    return fig


def _goodput(plt: Any, story: Story, t0: float) -> Any:
    ledger = story.ledger
    if ledger is None or ledger.total <= 0:
        return None
    fig, ax = plt.subplots(figsize=(10, 1.4))
    offset = 0.0
    present = [(name, 100 * value / ledger.total) for name, value in ledger.parts.items() if value > 0]
    for name, share in present:  # only the parts there are, each with its number
        ax.barh([0], [share], left=offset, color=_PART_COLOURS[name], label=f"{name} {share:.0f}%")
        if share >= 6:
            ax.text(offset + share / 2, 0, f"{share:.0f}%", ha="center", va="center", fontsize=8)
        offset += share
    ax.set_yticks([])
    ax.set_xlabel("% of the node-seconds")
    ax.legend(fontsize=7, ncol=max(1, len(present)), loc="upper center", bbox_to_anchor=(0.5, -0.5))
    return fig


def _metrics(plt: Any, story: Story, t0: float) -> Any:
    names = sorted({k for _, values in story.metrics for k in values})[:6]
    if not names:
        return None
    fig, axes = plt.subplots(1, len(names), figsize=(10, 3), squeeze=False)
    for ax, name in zip(axes[0], names):
        points = [(i if s is None else s, v[name]) for i, (s, v) in enumerate(story.metrics) if name in v]
        ax.plot([p for p, _ in points], [v for _, v in points], marker=".", lw=1)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("step")
    return fig


def page(story: Story, plots: List[Tuple[str, str]]) -> str:
    """The HTML page: no script, no link, no font or style from anywhere else."""
    esc = html.escape
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>clusterddp report: {esc(story.run_dir.name)}"
             "</title><style>body{font-family:sans-serif;max-width:1000px;margin:2em auto}pre{white-space:pre-wrap}"
             "img{display:block;max-width:100%}</style></head><body>",
             f"<h1>{esc(story.run_dir.name)}</h1><pre>{esc(summary(story))}</pre>"]
    for title, png in plots:
        parts.append(f"<h2>{esc(title)}</h2><img alt='{esc(title)}' src='data:image/png;base64,{png}'>")
    missing = story.missing()
    if missing:
        parts.append("<h2>Not in this report</h2><ul>" + "".join(f"<li>{esc(m)}</li>" for m in missing) + "</ul>")
    return "".join(parts) + "</body></html>\n"


def write(run_dir: Path, out: Optional[Path] = None) -> Tuple[Optional[Path], str]:
    """The report's file (None when there is nothing to draw) and the summary (or the one line saying what is
    missing)."""
    from ..datafiles import write_atomic

    story = gather(run_dir)
    if not story.steps and not story.attempts:
        return None, (f"nothing to report in {run_dir}: no " + "; no ".join(story.missing()[:2]))
    target = out or Path(run_dir) / REPORT_FILE
    write_atomic(target, page(story, figures(story)))
    return target, summary(story)
