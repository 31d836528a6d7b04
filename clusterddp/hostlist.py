"""Slurm host lists: ``expand("node[01-03],gpu7") == ["node01", "node02", "node03", "gpu7"]``.

Follows ``scontrol show hostnames``: the zero-padding width comes from the low bound's digits, several bracket
groups expand as a product (the last varies fastest), duplicates and order are kept. Text after a bracket
(``node[1-2]-ib``) is accepted as Slurm >= 23.02 does. Pure Python, no Slurm needed: the runtime uses it where
``scontrol`` is missing, and the first host never needs the whole list expanded.
"""
from __future__ import annotations

import itertools
import re
from typing import Iterator, List, Sequence, Tuple

from .contract import EXIT
from .errors import HostlistError

#: Slurm refuses a single range of more hosts than this (MAX_RANGE in hostlist.c).
MAX_RANGE = 64 * 1024
#: One node's name as clusterddp accepts it from files and Slurm's output (a host name: 63 characters at most).
NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")


def is_node_name(text: str) -> bool:
    return bool(NODE_NAME.fullmatch(text))

_SEPARATORS = ", \t\n"


# One bracket group: a list of (low, high, width) ranges.
_Ranges = List[Tuple[int, int, int]]


def _split_top(nodelist: str) -> Iterator[str]:
    """Yield the top-level host expressions, lazily (commas inside brackets do not split)."""
    depth = 0
    start = 0
    for i, ch in enumerate(nodelist):
        if ch == "[":
            if depth:
                raise HostlistError(f"nested '[' in host list {nodelist!r} at position {i}")
            depth = 1
        elif ch == "]":
            if not depth:
                raise HostlistError(f"unmatched ']' in host list {nodelist!r} at position {i}")
            depth = 0
        elif ch in _SEPARATORS and not depth:
            if i > start:
                yield nodelist[start:i]
            start = i + 1
    if depth:
        raise HostlistError(f"unclosed '[' in host list {nodelist!r}")
    if len(nodelist) > start:
        yield nodelist[start:]


# ASCII digits only, no spaces: what Slurm 22.05 accepts (Python's \d would take "１" and int() " 2").
_RANGE_RE = re.compile(r"([0-9]+)(?:-([0-9]+))?")


def _parse_ranges(body: str, expr: str) -> _Ranges:
    if not body.strip():
        raise HostlistError(f"empty brackets '[]' in {expr!r}")
    ranges: _Ranges = []
    for part in body.split(","):
        m = _RANGE_RE.fullmatch(part)
        if not m:
            raise HostlistError(f"bad range {part!r} in {expr!r}: expected N or N-M with decimal numbers")
        lo_s, hi_s = m.group(1), m.group(2)
        lo = int(lo_s)
        hi = int(hi_s) if hi_s is not None else lo
        if hi < lo:
            raise HostlistError(f"bad range {part!r} in {expr!r}: the high bound is below the low bound")
        if hi - lo + 1 > MAX_RANGE:
            raise HostlistError(
                f"range {part!r} in {expr!r} names {hi - lo + 1} hosts; Slurm allows at most {MAX_RANGE}")
        ranges.append((lo, hi, len(lo_s)))
    return ranges


def _parse_expr(expr: str) -> List[object]:
    """Split one host expression into literal strings and bracket groups (lists of ranges)."""
    parts: List[object] = []
    pos = 0
    while True:
        open_ = expr.find("[", pos)
        if open_ < 0:
            if expr[pos:]:
                parts.append(expr[pos:])
            return parts
        close = expr.find("]", open_)
        # _split_top already rejected unbalanced brackets; this guards direct calls.
        if close < 0:
            raise HostlistError(f"unclosed '[' in {expr!r}")
        if expr[pos:open_]:
            parts.append(expr[pos:open_])
        parts.append(_parse_ranges(expr[open_ + 1:close], expr))
        pos = close + 1


def _iter_ranges(ranges: _Ranges) -> Iterator[str]:
    for lo, hi, width in ranges:
        for n in range(lo, hi + 1):
            yield str(n).zfill(width)


#: Host names one expression may stand for (the product of its bracket groups): far above any cluster, and low
#: enough that a typo such as a[1-65536]b[1-65536] is an error instead of hours of work.
MAX_EXPR_HOSTS = 1 << 20  # the largest clusters have ~10^5 nodes; a list of 2^24 names is gigabytes


def _iter_expr(expr: str) -> Iterator[str]:
    parts = _parse_expr(expr)
    total = 1
    for p in parts:
        if not isinstance(p, str):
            total *= sum(hi - lo + 1 for lo, hi, _ in p)  # type: ignore[attr-defined]
            if total > MAX_EXPR_HOSTS:
                raise HostlistError(f"host expression {expr[:80]!r} names more than {MAX_EXPR_HOSTS} hosts")
    pools = [[p] if isinstance(p, str) else list(_iter_ranges(p)) for p in parts]  # type: ignore[arg-type]
    if len(pools) == 1:
        yield from pools[0]
        return
    for combo in itertools.product(*pools):
        yield "".join(combo)


def iter_hosts(nodelist: str) -> Iterator[str]:
    """Yield the host names of ``nodelist`` one by one (validating each expression as it is reached)."""
    for expr in _split_top(nodelist):
        yield from _iter_expr(expr)


def expand(nodelist: str) -> List[str]:
    """Every host name of a Slurm host list, in order, duplicates kept; validates the whole list. At most
    MAX_EXPR_HOSTS names in all (a list from a login node is data: a huge one is an error, not a MemoryError)."""
    out = []
    for host in iter_hosts(nodelist):
        out.append(host)
        if len(out) > MAX_EXPR_HOSTS:
            raise HostlistError(f"host list {nodelist[:80]!r} names more than {MAX_EXPR_HOSTS} hosts")
    return out


def first(nodelist: str) -> str:
    """The first host of ``nodelist`` without expanding the rest (O(1) in the list's length)."""
    exprs = _split_top(nodelist)
    try:
        expr = next(exprs)
    except StopIteration:
        raise HostlistError(f"empty host list {nodelist!r}") from None
    parts = _parse_expr(expr)
    return "".join(p if isinstance(p, str) else str(p[0][0]).zfill(p[0][2]) for p in parts)  # type: ignore[index]


_TRAILING_NUM = re.compile(r"^(.*?)(\d+)(\D*)$")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m clusterddp.hostlist [expand|first] LIST``: a scontrol stand-in for job scripts."""
    import sys

    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2 or args[0] not in ("expand", "first"):
        print("usage: python -m clusterddp.hostlist expand|first HOSTLIST", file=sys.stderr)
        return EXIT["USAGE"]
    try:
        hosts = expand(args[1]) if args[0] == "expand" else [first(args[1])]
    except HostlistError as exc:
        print(f"clusterddp.hostlist: {exc}", file=sys.stderr)
        return EXIT["RUNTIME"]
    sys.stdout.write("".join(h + "\n" for h in hosts))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
