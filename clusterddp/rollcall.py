"""The stack roll call: which rank waits where. Pure functions over per-rank stack dumps.

Shared by the job side (the hang watchdog writes a roll call into the run directory) and the login side
(``clusterddp stacks``); imports only clusterddp.contract and clusterddp.datafiles. A dump is a JSON object::

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

from . import contract, datafiles

Dump = Mapping[str, Any]
#: How many of a rank's own frames (innermost first) the roll call shows.
USER_FRAMES = 3
#: Bounds on what is read back from a run directory (which others may be able to write): a file as datafiles reads
#: it (datafiles.MAX_FILE); ranks and world sizes beyond MAX_WORLD are not a job's.
MAX_WORLD = 1 << 17
_MAX_ITEMS = 2000   # threads of a dump, frames of a thread
_MAX_TEXT = 1000    # characters of one string field


def is_rank(value: Any, world: int = MAX_WORLD) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < min(world, MAX_WORLD)


def _count(value: Any) -> Optional[int]:
    """A world size or ranks per node from a file: 1..MAX_WORLD, else None."""
    return value if is_rank(value) and value > 0 else None


def _text(value: Any, default: str = "?") -> str:
    return (value if isinstance(value, str) else default)[:_MAX_TEXT]


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
    """A dump read from a file someone may have written by hand: the shape checked and bounded, or None."""
    if not isinstance(data, dict) or not is_rank(data.get("rank")) or not isinstance(data.get("threads"), list):
        return None
    threads = []
    for t in data["threads"][:_MAX_ITEMS]:
        if not isinstance(t, dict) or not isinstance(t.get("frames"), list):
            return None
        frames = [{"file": _text(f.get("file")), "line": f["line"] if is_rank(f.get("line"), 1 << 31) else 0,
                   "func": _text(f.get("func")), "lib": bool(f.get("lib")), "text": _text(f.get("text"), "")}
                  for f in t["frames"][:_MAX_ITEMS] if isinstance(f, dict)]
        threads.append({"name": _text(t.get("name")), "main": bool(t.get("main")), "frames": frames})
    when = data.get("time")
    return {"rank": data["rank"], "node": _text(data.get("node")),
            "pid": data["pid"] if is_rank(data.get("pid"), 1 << 31) else None,
            "time": when if isinstance(when, (int, float)) and not isinstance(when, bool) and when == when else 0,
            "source": _text(data.get("source")), "threads": threads}


# --- the files (contract.py names them) ------------------------------------------------------------------
def write_dump(directory: Path, dump: Mapping[str, Any]) -> None:
    datafiles.write_atomic(directory / f"rank-{dump['rank']}.txt", format_dump(dump))
    datafiles.write_atomic(directory / f"rank-{dump['rank']}.json", json.dumps(dump))


def read_dumps(directory: Path) -> List[Dict[str, Any]]:
    out: Dict[int, Dict[str, Any]] = {}
    for path in sorted(directory.glob("rank-*.json"))[:MAX_WORLD]:
        dump = parse_dump(datafiles.read_json(path))
        if dump is not None and path.name == f"rank-{dump['rank']}.json":  # one per rank, filed under its own
            out[dump["rank"]] = dump
    return list(out.values())


def read_hellos(run_dir: Path, restart: Optional[int] = None) -> Dict[int, Dict[str, Any]]:
    """The ranks that started (of this restart; the latest one when ``restart`` is None): rank -> hello."""
    found: Dict[int, Dict[str, Any]] = {}
    for path in sorted((run_dir / contract.HELLO_FILE).parent.glob("rank-*.json"))[:MAX_WORLD]:
        hello = datafiles.read_json(path, 1 << 16)
        if not isinstance(hello, dict) or not is_rank(hello.get("rank")) or not is_rank(hello.get("restart"), 1 << 20) \
                or path.name != f"rank-{hello['rank']}.json":
            continue
        # Only the fields readers use, each of its type and within bounds (the file is data).
        clean = {"rank": hello["rank"], "restart": hello["restart"], "node": _text(hello.get("node")),
                 "state": _text(hello.get("state"), ""), "launcher": _text(hello.get("launcher"), ""),
                 "pid": hello["pid"] if is_rank(hello.get("pid"), 1 << 31) else None}
        for key in ("world_size", "local_world_size"):
            if _count(hello.get(key)) is not None:
                clean[key] = hello[key]
        if isinstance(hello.get("time"), (int, float)) and 0 < hello["time"] < 1e11:
            clean["time"] = float(hello["time"])
        found[hello["rank"]] = clean
    if restart is None and found:
        restart = max(h["restart"] for h in found.values())
    return {r: h for r, h in found.items() if h["restart"] == restart}


def _by_restart(run_dir: Path, pattern: str, restart: Optional[int]) -> Optional[Path]:
    """The file of ``pattern`` (a {restarts} field) of that restart, or of the latest one (``restart`` None):
    restarts ordered as numbers (rendezvous-10 after rendezvous-9)."""
    head, _, tail = pattern.partition("{restarts}")
    found = []
    for path in Path(run_dir).glob(pattern.format(restarts="*")):
        rel = path.relative_to(run_dir).as_posix()
        number = rel[len(head):len(rel) - len(tail)] if rel.startswith(head) and rel.endswith(tail) else ""
        if number.isdigit() and len(number) < 8:
            found.append((int(number), path))
    if restart is not None:
        found = [f for f in found if f[0] == restart]
    return max(found)[1] if found else None


def hang_report(run_dir: Path, restart: Optional[int] = None) -> Optional[Dict[str, Any]]:
    """The hang watchdog's roll call ({"text", "summary", "dir"}) of restart ``restart``, or of the latest restart
    that had one (None), or None."""
    path = _by_restart(Path(run_dir), contract.HANG_DIR + "/rollcall.txt", restart)
    if path is None:
        return None
    raw = datafiles.read_bounded(path)
    if raw is None:
        return None
    text = raw.decode("utf-8", "replace")
    data = datafiles.read_json(path.parent / "rollcall.json")
    line = _text(data.get("summary"), "") if isinstance(data, dict) else ""
    line = printable(line).replace("\n", "?")
    return {"text": printable(text), "summary": line or "hung (see the roll call)", "dir": str(path.parent)}


def rendezvous_failure(run_dir: Path, restart: Optional[int] = None) -> Optional[str]:
    """What the ranks reported when their rendezvous timed out (restart ``restart``, or the latest), or None."""
    found = _by_restart(Path(run_dir), contract.RENDEZVOUS_REPORT, restart)
    raw = datafiles.read_bounded(found, 1 << 16) if found else None
    return None if raw is None else printable(raw.decode("utf-8", "replace").strip()).replace("\n", "?")


def runtime_failure(run_dir: Path) -> Optional[Tuple[int, str]]:
    """Why the runtime ended a job, as shown after it (``--wait``, a local run): (exit code, lines), or None. The
    batch script writes the same into its log with shell lines of its own (templates/base.sh.j2)."""
    hang = hang_report(run_dir)
    if hang is not None:  # the runtime's watchdog ended the job: its roll call says more than tracebacks
        return contract.HANG_EXIT, (f"clusterddp: the hang watchdog ended the job ({hang['summary']}). Roll call:\n"
                                    f"{hang['text'].rstrip()}\nclusterddp: every rank's stacks: {hang['dir']}/")
    rendezvous = rendezvous_failure(run_dir)
    if rendezvous is not None:
        return contract.RENDEZVOUS_EXIT, f"clusterddp: {rendezvous}"
    return None
