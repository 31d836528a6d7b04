"""Finding the failure in a job's logs: which rank raised first, and its traceback."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Iterable, List, NamedTuple, Tuple

# Errors that ranks report when *another* rank died: listed after the root cause.
SECONDARY = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "communicator was aborted",
             "SignalException", "Socket Timeout", "ChildFailedError", "Signal 15 (SIGTERM)", "SIGTERM")
_STREAM_PREFIX = re.compile(r"^\[default(\d+)\]:")


class Traceback(NamedTuple):
    secondary: bool   # looks like a consequence of another rank's failure
    label: str        # which log (and which local rank inside it)
    lines: List[str]
    last: str         # the exception line


def streams(name: str, lines: Iterable[str]) -> List[Tuple[str, List[str]]]:
    """Split a log into (label, lines) per writer: torchrun's --tee prefixes lines with [default<local rank>]:."""
    groups: dict = {}
    for line in lines:
        m = _STREAM_PREFIX.match(line)
        label = f"{name} local rank {m.group(1)}" if m else name
        groups.setdefault(label, []).append(line[m.end():] if m else line)
    return list(groups.items())


def tracebacks(paths: Iterable[Path]) -> List[Traceback]:
    """Every traceback in ``paths``, root causes first (then in log order)."""
    found = []
    for path in paths:
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        for label, lines in streams(path.name, text.splitlines()):
            starts = [i for i, line in enumerate(lines) if "Traceback (most recent call last)" in line]
            if starts:
                block = lines[starts[0]:starts[0] + 60]
                last = next((line for line in reversed(block) if line.strip()), "")
                joined = "\n".join(block)
                found.append(Traceback(any(s in joined for s in SECONDARY), label, block, last.strip()))
    return sorted(found, key=lambda t: t.secondary)


def summary(found: List[Traceback], where: str) -> str:
    """A few lines for the terminal: where tracebacks are, then the first root cause in full."""
    if not found:
        return f"clusterddp: no traceback found; see {where}"
    head = "clusterddp: tracebacks in " + "; ".join(f"{t.label}: {t.last[:120]}" for t in found)
    return head + f"\nclusterddp: first failure ({found[0].label} in {where}):\n" + "\n".join(found[0].lines)
