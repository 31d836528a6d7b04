"""The stack roll call: which rank waits where. Pure functions over per-rank stack dumps.

Shared by the job side (the hang watchdog writes a roll call into the run directory) and the login side
(``clusterddp stacks``); imports only clusterddp.contract. A dump is a JSON object::

    {"rank": 1, "node": "c2", "pid": 4711, "time": 1764500000.0, "source": "runtime" | "py-spy",
     "threads": [{"name": "MainThread", "main": true,
                  "frames": [{"file": "/home/u/train.py", "line": 120, "func": "main", "lib": false}, ...]}]}

Frames run outermost first; ``lib`` marks the interpreter's, installed packages' and clusterddp's own code, decided
where the dump was taken (the paths differ between machines).
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from . import contract

Dump = Mapping[str, Any]
#: How many of a rank's own frames (innermost first) the roll call shows.
USER_FRAMES = 3


def printable(text: str) -> str:
    """``text`` with every character that could drive a terminal shown as '?' (newlines kept): files in a shared
    run directory are data."""
    return "".join(c if c.isprintable() or c == "\n" else "?" for c in text)


def is_library(path: str, prefixes: Sequence[str]) -> bool:
    """Code the user did not write: frozen modules, installed packages, the standard library, clusterddp."""
    if not path or path.startswith("<"):
        return True
    if "/site-packages/" in path or "/dist-packages/" in path:
        return True
    return any(path == p or path.startswith(p.rstrip("/") + "/") for p in prefixes)


def main_thread(dump: Dump) -> List[Mapping[str, Any]]:
    """The frames of the rank's main thread (where training runs), outermost first."""
    threads = list(dump.get("threads") or [])
    for t in threads:
        if t.get("main"):
            return list(t.get("frames") or [])
    return list(threads[0].get("frames") or []) if threads else []


def _short(frame: Mapping[str, Any]) -> str:
    return f"{os.path.basename(str(frame.get('file', '?')))}:{frame.get('line', '?')} {frame.get('func', '?')}"


def place(frames: Sequence[Mapping[str, Any]]) -> Tuple[str, Tuple[str, ...]]:
    """(the library function the rank is inside, or '' when it is in its own code; its own frames, innermost
    first). The key the roll call groups ranks by."""
    if not frames:
        return "", ()
    user = [f for f in frames if not f.get("lib")]
    inner = frames[-1]
    waiting = str(inner.get("func", "?")) if inner.get("lib") else ""
    shown = tuple(_short(f) for f in reversed(user[-USER_FRAMES:])) if user else (_short(inner),)
    return waiting, shown


def describe_place(key: Tuple[str, Tuple[str, ...]]) -> str:
    waiting, frames = key
    return "  <- ".join(([waiting] if waiting else []) + list(frames))


def ranges(numbers: Iterable[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5'."""
    nums = sorted(set(numbers))
    out: List[str] = []
    i = 0
    while i < len(nums):
        j = i
        while j + 1 < len(nums) and nums[j + 1] == nums[j] + 1:
            j += 1
        out.append(str(nums[i]) if i == j else (f"{nums[i]},{nums[j]}" if j == i + 1 else f"{nums[i]}-{nums[j]}"))
        i = j + 1
    return ",".join(out)


def build(dumps: Sequence[Dump], world_size: int, missing: Mapping[int, str]) -> Dict[str, Any]:
    """The roll call as data: groups (largest first), missing ranks with why, and a one-line summary.

    ``missing`` maps a rank that gave no dump to what is known about it ("node c2: never started")."""
    groups: Dict[Tuple[str, Tuple[str, ...]], List[Dump]] = {}
    for d in sorted(dumps, key=lambda d: int(d["rank"])):
        groups.setdefault(place(main_thread(d)), []).append(d)
    ordered = sorted(groups.items(), key=lambda kv: (-len(kv[1]), min(int(d["rank"]) for d in kv[1])))
    out_groups = []
    for (waiting, frames), members in ordered:
        out_groups.append({
            "ranks": [int(d["rank"]) for d in members],
            "nodes": sorted({str(d.get("node", "?")) for d in members}),
            "waiting_in": waiting, "frames": list(frames), "where": describe_place((waiting, frames)),
        })
    result = {"world_size": world_size, "answered": len(dumps), "groups": out_groups,
              "missing": [{"rank": r, "why": missing[r]} for r in sorted(missing)]}
    result["summary"] = summary(result)
    return result


def summary(call: Mapping[str, Any]) -> str:
    """One line for `status`: 'rank 1 at data.py:40 __getitem__; 3 ranks wait at all_reduce'."""
    groups = list(call["groups"])
    parts: List[str] = []
    for g in groups[1:] + groups[:1]:  # the odd ones out first: they are the likely cause
        n = len(g["ranks"])
        who = f"rank {g['ranks'][0]}" if n == 1 else f"{n} ranks ({ranges(g['ranks'])})"
        if g["waiting_in"]:
            parts.append(f"{who} {'waits' if n == 1 else 'wait'} in {g['waiting_in']} at {g['frames'][0]}"
                         if g["frames"] else f"{who} in {g['waiting_in']}")
        else:
            parts.append(f"{who} at {g['frames'][0] if g['frames'] else '?'}")
    if call["missing"]:
        parts.insert(0, f"rank(s) {ranges(m['rank'] for m in call['missing'])} did not answer")
    return "; ".join(parts) if parts else "no rank answered"


def format_text(call: Mapping[str, Any]) -> str:
    """The roll call as people read it: the largest group first, the odd ones out named, then who is missing."""
    lines: List[str] = []
    groups = list(call["groups"])
    world = call["world_size"]
    for i, g in enumerate(groups):
        n = len(g["ranks"])
        nodes = f" on {g['nodes'][0]}" if len(g["nodes"]) == 1 else f" on {len(g['nodes'])} nodes"
        if i == 0 and (n > 1 or len(groups) == 1):
            verb = "wait" if g["waiting_in"] else "are"
            lines.append(f"{n} of {world} ranks {verb} at the same place: {g['where']}   "
                         f"(rank{'s' if n > 1 else ''} {ranges(g['ranks'])}{nodes})")
            continue
        who = f"rank {g['ranks'][0]} ({g['nodes'][0]})" if n == 1 else f"ranks {ranges(g['ranks'])}{nodes}"
        lines.append(f"{who} {'is' if n == 1 else 'are'} elsewhere:  {g['where']}      <- look here")
    if not groups:
        lines.append(f"no rank of {world} answered")
    if call["missing"]:
        for m in call["missing"]:
            lines.append(f"missing: rank {m['rank']} ({m['why']})")
    else:
        lines.append("missing: none")
    return "\n".join(lines) + "\n"


def format_dump(dump: Dump) -> str:
    """One rank's full dump, every thread, as a traceback-like text (the rank-N.txt files)."""
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(dump.get("time", 0))))
    lines = [f"rank {dump['rank']} on {dump.get('node', '?')}, pid {dump.get('pid', '?')}, at {when} "
             f"({dump.get('source', '?')})"]
    for t in dump.get("threads") or []:
        lines.append(f"\nThread {t.get('name', '?')}{' (main)' if t.get('main') else ''}, innermost last:")
        for f in t.get("frames") or []:
            lines.append(f'  File "{f.get("file")}", line {f.get("line")}, in {f.get("func")}')
            if f.get("text"):
                lines.append(f"    {f['text']}")
    return "\n".join(lines) + "\n"


def parse_dump(data: Any) -> Optional[Dict[str, Any]]:
    """A dump read from a file someone may have written by hand: the shape checked, or None."""
    if not isinstance(data, dict) or not isinstance(data.get("rank"), int) or not isinstance(
            data.get("threads"), list):
        return None
    threads = []
    for t in data["threads"]:
        if not isinstance(t, dict) or not isinstance(t.get("frames"), list):
            return None
        frames = [{"file": str(f.get("file", "?")), "line": f.get("line") if isinstance(f.get("line"), int) else 0,
                   "func": str(f.get("func", "?")), "lib": bool(f.get("lib")), "text": str(f.get("text") or "")}
                  for f in t["frames"] if isinstance(f, dict)]
        threads.append({"name": str(t.get("name", "?")), "main": bool(t.get("main")), "frames": frames})
    return {"rank": data["rank"], "node": str(data.get("node", "?")), "pid": data.get("pid"),
            "time": data.get("time", 0) if isinstance(data.get("time"), (int, float)) else 0,
            "source": str(data.get("source", "?")), "threads": threads}


# --- the files (contract.py names them) ------------------------------------------------------------------
def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_dump(directory: Path, dump: Mapping[str, Any]) -> None:
    write_atomic(directory / f"rank-{dump['rank']}.txt", format_dump(dump))
    write_atomic(directory / f"rank-{dump['rank']}.json", json.dumps(dump))


def read_dumps(directory: Path) -> List[Dict[str, Any]]:
    out = []
    for path in directory.glob("rank-*.json"):
        try:
            dump = parse_dump(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
        if dump is not None:
            out.append(dump)
    return out


def read_hellos(run_dir: Path, restart: Optional[int] = None) -> Dict[int, Dict[str, Any]]:
    """The ranks that started (of this restart; the latest one when ``restart`` is None): rank -> hello."""
    found: Dict[int, Dict[str, Any]] = {}
    for path in (run_dir / contract.HELLO_FILE).parent.glob("rank-*.json"):
        try:
            hello = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(hello, dict) and isinstance(hello.get("rank"), int) and isinstance(hello.get("restart"), int):
            found[hello["rank"]] = hello
    if restart is None and found:
        restart = max(h["restart"] for h in found.values())
    return {r: h for r, h in found.items() if h["restart"] == restart}


def hang_report(run_dir: Path) -> Optional[Dict[str, Any]]:
    """The hang watchdog's roll call of the latest restart that had one ({"text", "summary", "dir"}), or None."""
    found = []
    for path in Path(run_dir).glob(contract.HANG_DIR.format(restarts="*") + "/rollcall.txt"):
        suffix = path.parent.name.rsplit("-", 1)[-1]
        if suffix.isdigit():
            found.append((int(suffix), path))
    if not found:
        return None
    path = max(found)[1]
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return None
    try:
        data = json.loads((path.parent / "rollcall.json").read_text())
        line = str(data.get("summary", "")) if isinstance(data, dict) else ""
    except (OSError, ValueError):
        line = ""
    line = printable(line).replace("\n", "?")
    return {"text": printable(text), "summary": line or "hung (see the roll call)", "dir": str(path.parent)}


def rendezvous_failure(run_dir: Path) -> Optional[str]:
    """What the ranks reported when their rendezvous timed out (latest restart), or None."""
    found = sorted(Path(run_dir).glob(contract.RENDEZVOUS_REPORT.format(restarts="*")))
    try:
        text = found[-1].read_text(errors="replace").strip() if found else None
    except OSError:
        return None
    return None if text is None else printable(text).replace("\n", "?")
