"""A run's metrics as the script recorded them (``runtime.report``: metrics.jsonl), read as data: bounded, each line
checked. The report plots them; a sweep's status table takes each trial's last and best values from them."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from .. import contract
from ..datafiles import parse_json, read_bounded
from ..rollcall import printable

_MAX_LINES = 100_000


def read(run_dir: Path, problems: Optional[List[str]] = None) -> List[Tuple[Optional[int], Dict[str, float]]]:
    """(step, metrics) per line of metrics.jsonl; a line that is not one such object is skipped, and said once per
    file in ``problems`` (how many lines, the first one's number and why)."""
    raw = read_bounded(run_dir / contract.METRICS_FILE, 64 << 20)
    out = []
    bad: List[Tuple[int, str]] = []
    for number, line in enumerate((raw or b"").decode("utf-8", "replace").split("\n")[:_MAX_LINES], 1):
        if not line.strip():
            continue
        try:
            item = parse_json(line)
        except ValueError as exc:
            bad.append((number, str(exc)[:80]))
            continue
        values = item.get("metrics") if isinstance(item, dict) else None
        if not isinstance(values, dict):
            bad.append((number, "not an object with metrics"))
            continue
        clean = {}
        for k, v in values.items():
            if isinstance(k, str) and k.isidentifier() and len(k) <= 64:
                value = float(v) if isinstance(v, (int, float, str)) and _numeric(v) else None
                if value is not None:
                    clean[k] = value
        step = item.get("step")
        out.append((step if isinstance(step, int) and not isinstance(step, bool) else None, clean))
    if bad and problems is not None:
        first, why = bad[0]
        problems.append(f"{run_dir.name}/{contract.METRICS_FILE}: {len(bad)} line(s) not read (line {first}: "
                        f"{printable(why)})")
    return out


def _numeric(v: Any) -> bool:
    try:
        float(v)
        return True
    except (ValueError, OverflowError):  # (an int of 400 digits is JSON, and no float)
        return False
