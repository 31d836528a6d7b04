"""The fire drill's eyes inside the job (`clusterddp drill`): what each rank did, one JSON line per event in
``$CLUSTERDDP_DRILL_DIR/rank-R.jsonl``: every should_stop() call (a step), every value all_reduce_mean returned,
every checkpoint saved and what load_latest restored. With ``CLUSTERDDP_DRILL_STOP_AT=K`` the K-th should_stop()
answers True, as the time-limit warning would. Off (one environment lookup) outside a drill."""
from __future__ import annotations

import json
import os
from typing import Any, Dict, Optional

from .. import contract

_COUNT: Dict[str, int] = {"steps": 0}


def _path() -> Optional[str]:
    directory = os.environ.get(contract.DRILL_DIR)
    if not directory:
        return None
    return os.path.join(directory, f"rank-{os.environ.get('RANK', '0')}.jsonl")


def record(event: Dict[str, Any]) -> None:
    path = _path()
    if path is None:
        return
    event = dict(event, n=_COUNT["steps"])
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(event, sort_keys=True) + "\n")


def step() -> bool:
    """Called by should_stop(): counts the step; True at the step the drill stops at."""
    if _path() is None:
        return False
    _COUNT["steps"] += 1
    record({"e": "step"})
    stop_at = os.environ.get(contract.DRILL_STOP_AT, "")
    return stop_at.isdigit() and _COUNT["steps"] == int(stop_at)


def value(v: Any) -> Any:
    """A value the script reported (all_reduce_mean), exactly: float.hex of each element; returns ``v``."""
    if _path() is None:
        return v
    try:
        items = [float(x) for x in (v.detach().reshape(-1).tolist() if hasattr(v, "detach") else [v])]
    except (TypeError, ValueError):
        return v
    record({"e": "value", "v": [x.hex() for x in items[:64]]})
    return v
