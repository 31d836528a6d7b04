"""The fire drill's eyes inside the job (`clusterddp drill`): what each rank did, one JSON line per event in
``$CLUSTERDDP_DRILL_DIR/rank-R.jsonl``: every should_stop() call (a step), every value all_reduce_mean returned,
every checkpoint saved and what load_latest restored. With ``CLUSTERDDP_DRILL_STOP_AT=K`` the K-th should_stop()
answers True, as the time-limit warning would (``+K``: the K-th of a process that resumed); while the drill's hold
file exists, every rank waits at its first should_stop() after a checkpoint (the drill kills a node there). Off
(one environment lookup) outside a drill."""
from __future__ import annotations

import json
import os
import time
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
    if event.get("e") == "save":
        _COUNT["saved"] = 1
        _COUNT.setdefault("saved_at", _COUNT["steps"])
    elif event.get("e") == "load" and event.get("step") is not None:
        _COUNT["resumed"] = 1
    event = dict(event, n=_COUNT["steps"])
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(event, sort_keys=True) + "\n")


def step() -> bool:
    """Called by should_stop(): counts the step; True at the step the drill stops at."""
    if _path() is None:
        return False
    _COUNT["steps"] += 1
    record({"e": "step"})
    hold = os.path.join(os.environ[contract.DRILL_DIR], contract.DRILL_HOLD)
    if _COUNT.get("saved") and _COUNT["steps"] >= _COUNT["saved_at"] + 2 and os.path.exists(hold):
        # The drill kills a node here, a step after the first checkpoint (a checkpoint restart redoes it, a peer
        # heal does not), on every rank at the same step: each rank says it holds and waits until the drill has
        # killed its victims (then the survivors meet a peer gone).
        open(os.path.join(os.environ[contract.DRILL_DIR], f"held-rank-{os.environ.get('RANK', '0')}"), "w").close()
        while os.path.exists(hold):
            time.sleep(0.02)
    stop_at = os.environ.get(contract.DRILL_STOP_AT, "")
    if stop_at.startswith("+") and not _COUNT.get("resumed"):
        return False  # ("+K": the K-th step of a process that resumed, as a job stopped after a node's loss)
    if stop_at.lstrip("+").isdigit() and _COUNT["steps"] == int(stop_at.lstrip("+")):
        record({"e": "stop"})  # (the drill learns that, and where, the stop came: a run may end before it)
        return True
    return False


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
