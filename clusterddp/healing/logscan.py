"""Finding the failure in a job's logs: which rank raised first, and its traceback."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Dict, Iterable, Iterator, List, NamedTuple

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
_RANK_PREFIX = re.compile(r"^\[rank\d{1,7}\]:\s?")
_INSIDE = ("Traceback", "During handling of the above exception", "The above exception was the direct cause")
_AFTER = 40          # lines a writer may print after its traceback's block (exit warnings) for it to be its end


def _lines(path: Path) -> Iterator[str]:
    """The lines of a log as a stream (a log may be gigabytes; a link is not followed: logs are data)."""
    return lines(path, _LINE)


def tracebacks(paths: Iterable[Path]) -> List[Traceback]:
    """Every writer's last traceback in ``paths`` when it is the writer's last words, root causes first (then in log
    order). A traceback followed by more than a few lines of the same writer was printed and handled (the program
    went on): never a cause. Logs are read once, line by line, keeping only the blocks found."""
    found = []
    for path in paths:
        blocks: Dict[str, _Block] = {}  # label -> its latest traceback
        for raw in _lines(path):
            m = _STREAM_PREFIX.match(raw)
            label = f"{path.name} local rank {m.group(1)}" if m else path.name
            line = raw[m.end():] if m else raw
            if "Traceback (most recent call last)" in line:
                blocks[label] = _Block([line])
            elif label in blocks:
                blocks[label].add(line)
        for label, b in blocks.items():
            if b.after > _AFTER:
                continue
            last = b.last or next((line for line in reversed(b.lines) if line.strip()), "")
            joined = "\n".join(b.lines)
            found.append(Traceback(any(s in joined for s in SECONDARY), label, b.lines, last.strip()))
    return sorted(found, key=lambda t: t.secondary)


class _Block:
    """One traceback as it is read: its first lines, its exception line once seen, the writer's lines after it."""

    def __init__(self, lines: List[str]) -> None:
        self.lines, self.last, self.after = lines, "", 0

    def add(self, line: str) -> None:
        if self.last:
            self.after += 1
        else:
            bare = _RANK_PREFIX.sub("", line)  # torch prefixes an uncaught exception's lines with "[rank0]: "
            if bare.strip() and not bare[0].isspace() and not bare.startswith(_INSIDE):
                self.last = line  # the exception line ends the traceback (frames are indented)
        if len(self.lines) < _BLOCK:
            self.lines.append(line)


def summary(found: List[Traceback], where: str) -> str:
    """A few lines for the terminal: where tracebacks are, then the first root cause in full."""
    if not found:
        return f"clusterddp: no traceback found; see {where}"
    head = "clusterddp: tracebacks in " + "; ".join(f"{t.label}: {t.last[:120]}" for t in found)
    # Log text is data: shown through the one printable filter (no terminal control sequences).
    what = ("first traceback, a reaction to a lost peer rather than a cause" if found[0].secondary
            else "first failure")
    return printable(head + f"\nclusterddp: {what} ({found[0].label} in {where}):\n" + "\n".join(found[0].lines))
