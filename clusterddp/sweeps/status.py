"""A sweep's trials as they stand: Slurm asked once for every task of the sweep's arrays (squeue), each trial's
latest run directory read for its end (attempts.tsv) and its metrics (metrics.jsonl); the results table.
A remote sweep's small files come back in one rsync. Files in run directories are data: bounded and checked."""
from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .. import contract
from ..backends.jobinfo import QUEUED_STATES, JobState
from ..datafiles import read_json
from ..healing import attempts
from ..job.ids import HERE
from ..observe import goodput, metrics
from ..rollcall import printable
from .run import LOCAL_RECORDS, SweepRecord

#: Metrics whose best value is the largest (the rest: the smallest); --maximize/--minimize decide otherwise.
MAXIMIZED = ("acc", "accuracy", "top1", "top5", "auc", "f1", "precision", "recall", "score", "reward", "iou", "map",
             "bleu")
QUEUED = QUEUED_STATES


@dataclass
class TrialState:
    key: str
    index: int
    params: List[Tuple[str, str]]
    state: str                      # COMPLETED, FAILED, MISSING (submitted, never ran) or Slurm's queue state
    job: str = ""                   # the array task (1234_5) or the local run
    elapsed: Optional[int] = None   # seconds
    why: str = ""
    run_dir: str = ""
    last: Dict[str, float] = field(default_factory=dict)
    best: Dict[str, float] = field(default_factory=dict)

    @property
    def has_result(self) -> bool:
        return self.state != JobState.MISSING


def maximized(metric: str, maximize: Sequence[str] = (), minimize: Sequence[str] = ()) -> bool:
    if metric in maximize or metric in minimize:
        return metric in maximize
    return metric.lower().split("_")[-1] in MAXIMIZED or metric.lower() in MAXIMIZED


def _queue(record: SweepRecord) -> Dict[str, Tuple[str, str]]:
    """array task (1234_5) -> (state, elapsed), for this user's jobs of the sweep: one squeue call."""
    if record.cluster == LOCAL_RECORDS:
        return {}
    # Raises when the queue cannot be read: a queued trial must never look as if it never ran (and run again).
    return _backend(record).queue(sorted({s["job_id"] for s in record.submissions}))


def _backend(record: SweepRecord) -> Any:
    from .. import backends
    from ..job.clusters import by_name

    return backends.get(by_name(record.cluster))


def _local_dir(record: SweepRecord) -> Path:
    """The sweep directory readable here (a remote one: its trial files copied back, only what changed)."""
    if record.cluster in (LOCAL_RECORDS, HERE):
        return Path(record.sweep_dir)
    return _backend(record).readable_tree(record.sweep_dir, f"sweep-{record.name}",
                                          (contract.TRIAL_FILE, contract.ATTEMPTS_FILE, contract.METRICS_FILE))


def states(record: SweepRecord, maximize: Sequence[str] = (), minimize: Sequence[str] = (),
           problems: Optional[List[str]] = None) -> List[TrialState]:
    """Every trial of the record, in grid order: its state, its latest run, its metrics. A file that cannot be
    read as what it should be is one line in ``problems`` (the rest is shown)."""
    queue = _queue(record)
    base = _local_dir(record)
    runs: Dict[str, List[Tuple[float, Path]]] = {}
    for trial_file in base.glob(f"*/{contract.TRIAL_FILE}") if base.is_dir() else []:
        data = read_json(trial_file, 1 << 16)
        if isinstance(data, dict) and data.get("sweep") == record.name and isinstance(data.get("key"), str) \
                and data["key"] in record.trials:
            runs.setdefault(data["key"], []).append((trial_file.stat().st_mtime, trial_file.parent))
        elif problems is not None and not (isinstance(data, dict) and isinstance(data.get("key"), str)):
            problems.append(f"{trial_file.parent.name}/{contract.TRIAL_FILE}: not a trial record (JSON with a "
                            "string key); that run directory is left out")
    task_of = {key: f"{s['job_id']}_{index}" for s in record.submissions for index, key in s["tasks"].items()}
    out = []
    for key, t in sorted(record.trials.items(), key=lambda kv: (kv[1]["index"], kv[0])):
        st = TrialState(key, int(t["index"]), [(str(k), str(v)) for k, v in t["params"]], JobState.MISSING,
                        job=task_of.get(key, ""))
        latest = max(runs.get(key, []), default=None)
        if latest is not None:
            st.run_dir = str(latest[1])
            st.job = st.job or latest[1].name  # a local trial: its run directory
            ended = attempts.read(latest[1])
            if ended:
                last = ended[-1]
                st.elapsed = max(0, last.end - ended[0].start)
                st.state = JobState.COMPLETED if last.exit == 0 and last.next == contract.NEXT_END else JobState.FAILED
                st.why = "" if st.state == JobState.COMPLETED else f"exit {last.exit}" + (
                    f": {last.fault}: {last.why}" if last.fault else f" ({last.why})" if last.why else "")
            else:
                st.state, st.why = JobState.FAILED, "ended without a result (cancelled, or killed before its end)"
            for _, values in metrics.read(latest[1], problems):
                for name, v in values.items():
                    st.last[name] = v
                    if math.isnan(v):
                        continue
                    better = max if maximized(name, maximize, minimize) else min
                    st.best[name] = better(st.best.get(name, v), v)
        if st.job in queue:
            st.state, elapsed = queue[st.job]
            st.elapsed = _seconds(elapsed)
            st.why = ""
        out.append(st)
    return out


def _seconds(text: str) -> Optional[int]:
    """squeue's %M ([days-]hours:minutes:seconds, or minutes:seconds) in seconds."""
    days, _, rest = text.rpartition("-")
    parts = rest.split(":")
    if not all(p.isdigit() for p in parts) or not 1 <= len(parts) <= 3 or (days and not days.isdigit()):
        return None
    seconds = 0
    for p in parts:
        seconds = seconds * 60 + int(p)
    return seconds + int(days or 0) * 86400


def _clock(seconds: Optional[int]) -> str:
    if seconds is None:
        return "-"
    h, rest = divmod(seconds, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}"


def _value(v: Optional[float]) -> str:
    return "-" if v is None else f"{v:.6g}"


def param_names(rows: Sequence[TrialState]) -> List[str]:
    """Every parameter of the sweep's trials, in the order they first appear (a later grid may add some)."""
    return list(dict.fromkeys(n for r in rows for n, _ in r.params))


def metric_names(rows: Sequence[TrialState]) -> List[str]:
    return sorted({m for r in rows for m in r.last})


def ordered(rows: Sequence[TrialState], sort: Optional[str], maximize: Sequence[str] = (),
            minimize: Sequence[str] = ()) -> List[TrialState]:
    """By ``sort``'s best value, the best first (trials without it last), else in grid order."""
    if not sort:
        return list(rows)
    sign = -1 if maximized(sort, maximize, minimize) else 1
    return sorted(rows, key=lambda r: (sort not in r.best, sign * r.best.get(sort, 0.0), r.index))


def table(record: SweepRecord, rows: Sequence[TrialState], maximize: Sequence[str] = (),
          minimize: Sequence[str] = (), problems: Sequence[str] = ()) -> str:
    """The results table as people read it: one row per trial, columns aligned; then a line per trial that did not
    end well and per file that could not be read."""
    names = param_names(rows)
    ms = metric_names(rows)
    head = ["trial", *names, "state", *[c for m in ms for c in
                                         (f"{m} last", f"{m} {'max' if maximized(m, maximize, minimize) else 'min'}")],
            "elapsed", "job"]
    body = [[str(r.index), *[dict(r.params).get(n, "-") for n in names], r.state,
             *[c for m in ms for c in (_value(r.last.get(m)), _value(r.best.get(m)))], _clock(r.elapsed), r.job]
            for r in rows]
    cells = [[printable(c).replace("\n", "?")[:40] for c in row] for row in [head, *body]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    tally: Dict[str, int] = {}
    for r in rows:
        tally[r.state] = tally.get(r.state, 0) + 1
    summary = ", ".join(f"{n} {s}" for s, n in sorted(tally.items()))
    arrays = ", ".join(s["job_id"] for s in record.submissions) or "none"
    where = "run here (--local)" if record.cluster == LOCAL_RECORDS else f"array job(s) {arrays}"
    notes = [f"  trial {r.index}: {printable(r.why)}" for r in rows if r.why]
    total = sweep_goodput(rows)
    ledger = [f"sweep {total.line()} (its trials together)"] if total.total > 0 else []
    unread = [f"  not read: {printable(p)}" for p in problems]
    return "\n".join([f"sweep {record.name}: {len(rows)} trial(s): {summary}; {where}", *lines, *notes, *unread,
                      *ledger]) + "\n"


def sweep_goodput(rows: Sequence[TrialState]) -> goodput.Ledger:
    """The trials' goodput ledgers added up (their latest runs)."""
    total = goodput.Ledger()
    for r in rows:
        found = goodput.ledger(Path(r.run_dir)) if r.run_dir else None
        if found is not None:
            total.add(found)
    return total


def as_json(rows: Sequence[TrialState]) -> str:
    return json.dumps([{"trial": r.index, "key": r.key, "params": dict(r.params), "state": r.state, "job": r.job,
                        "elapsed": r.elapsed, "last": r.last, "best": r.best, "run_dir": r.run_dir, "why": r.why}
                       for r in rows], indent=2, sort_keys=True, default=str)


def as_csv(rows: Sequence[TrialState]) -> str:
    buf = io.StringIO()
    names = param_names(rows)
    ms = metric_names(rows)
    w = csv.writer(buf)
    w.writerow(["trial", *names, "state", *[c for m in ms for c in (f"{m}_last", f"{m}_best")], "elapsed", "job"])
    for r in rows:
        w.writerow([r.index, *[dict(r.params).get(n, "") for n in names], r.state,
                    *[c for m in ms for c in (r.last.get(m, ""), r.best.get(m, ""))],
                    "" if r.elapsed is None else r.elapsed, r.job])
    return buf.getvalue()
