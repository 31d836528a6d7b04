"""Finding the failure in a job's logs: which rank raised first, and its traceback."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Iterable, Iterator, List, NamedTuple

from ..datafiles import lines
from ..rollcall import printable

# Errors that ranks report when *another* rank died: listed after the root cause.
SECONDARY = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "communicator was aborted",
             "SignalException", "Socket Timeout", "ChildFailedError", "Signal 15 (SIGTERM)", "SIGTERM")
_STREAM_PREFIX = re.compile(r"^\[default(\d+)\]:")


class Traceback(NamedTuple):
    secondary: bool   # looks like a consequence of another rank's failure
    label: str        # which log (and which local rank inside it)
    lines: List[str]
    last: str         # the exception line


_BLOCK = 60          # lines of a traceback kept
_LINE = 1 << 16      # characters of a line read at a time: a log with one huge line is read in pieces


def _lines(path: Path) -> Iterator[str]:
    """The lines of a log as a stream (a log may be gigabytes; a link is not followed: logs are data)."""
    return lines(path, _LINE)


def tracebacks(paths: Iterable[Path]) -> List[Traceback]:
    """Every writer's first traceback in ``paths``, root causes first (then in log order). Logs are read once,
    line by line, keeping only the blocks found."""
    found = []
    for path in paths:
        blocks: dict = {}  # label -> lines of its first traceback
        for raw in _lines(path):
            m = _STREAM_PREFIX.match(raw)
            label = f"{path.name} local rank {m.group(1)}" if m else path.name
            line = raw[m.end():] if m else raw
            block = blocks.get(label)
            if block is None:
                if "Traceback (most recent call last)" in line:
                    blocks[label] = [line]
            elif len(block) < _BLOCK:
                block.append(line)
        for label, block in blocks.items():
            last = next((line for line in reversed(block) if line.strip()), "")
            joined = "\n".join(block)
            found.append(Traceback(any(s in joined for s in SECONDARY), label, block, last.strip()))
    return sorted(found, key=lambda t: t.secondary)


def summary(found: List[Traceback], where: str) -> str:
    """A few lines for the terminal: where tracebacks are, then the first root cause in full."""
    if not found:
        return f"clusterddp: no traceback found; see {where}"
    head = "clusterddp: tracebacks in " + "; ".join(f"{t.label}: {t.last[:120]}" for t in found)
    # Log text is data: shown through the one printable filter (no terminal control sequences).
    what = ("first traceback, a reaction to a lost peer rather than a cause" if found[0].secondary
            else "first failure")
    return printable(head + f"\nclusterddp: {what} ({found[0].label} in {where}):\n" + "\n".join(found[0].lines))
