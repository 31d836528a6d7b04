"""Nodes found at fault, remembered per cluster and left out of later submissions for a while.

One JSON file per cluster in the user's state directory (``$XDG_STATE_HOME/clusterddp/quarantine/<cluster>.json``):
``{"node2": {"reason": "...", "job": "1234", "since": 1764500000.0}}``. Read as data (bounded, no link followed,
names checked: they reach an ``#SBATCH --exclude`` line); written atomically.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Dict, Iterable, Mapping, Optional

from .. import dirs
from ..datafiles import read_json, write_atomic
from ..hostlist import is_node_name
from ..job.ids import check_cluster_name as check_name
from ..rollcall import printable

#: How long a node stays excluded after a fault (seconds), unless forgotten.
DEFAULT_SECONDS = 24 * 3600


def path(cluster: str) -> Path:
    return dirs.base("state") / "quarantine" / f"{check_name(cluster)}.json"


def _read(cluster: str) -> Dict[str, dict]:
    data = read_json(path(cluster), 1 << 20)
    if not isinstance(data, dict):
        return {}
    out = {}
    for node, entry in data.items():
        if (isinstance(node, str) and is_node_name(node) and isinstance(entry, dict)
                and isinstance(entry.get("since"), (int, float)) and isinstance(entry.get("reason"), str)):
            out[node] = {"reason": printable(entry["reason"])[:300], "job": str(entry.get("job", ""))[:40],
                         "since": float(entry["since"])}
    return out


def _write(cluster: str, entries: Mapping[str, dict]) -> None:
    write_atomic(path(cluster), json.dumps(dict(sorted(entries.items())), indent=1))


def active(cluster: str, seconds: float = DEFAULT_SECONDS, now: Optional[float] = None) -> Dict[str, dict]:
    """The quarantined nodes of ``cluster`` whose time has not run out: node -> {reason, job, since}."""
    now = time.time() if now is None else now
    return {n: e for n, e in _read(cluster).items() if now - e["since"] < seconds}


def add(cluster: str, nodes: Iterable[str], reason: str, job: str) -> list:
    """Quarantine ``nodes`` (a new fault restarts the clock); returns the nodes added."""
    entries = _read(cluster)
    added = [n for n in nodes if is_node_name(n)]
    if not added:
        return []
    for node in added:
        if entries.get(node, {}).get("job") != job:  # the same job seen again (status, --wait) keeps its time
            entries[node] = {"reason": printable(reason)[:300], "job": job, "since": time.time()}
    _write(cluster, entries)
    return added


def forget(cluster: str, node: str) -> bool:
    """Drop ``node`` from the list; False when it was not on it."""
    entries = _read(cluster)
    if node not in entries:
        return False
    del entries[node]
    _write(cluster, entries)
    return True
