"""Sweeps as data: parameter grids -> trials, each trial's identity (its parameters and the code it runs), and what
a trial's batch script exports. Pure: nothing here runs, reads the cluster or writes (run.py does).

A grid is one axis (``lr=0.1,0.01``); a zip is one axis of several parameters that vary together (from a sweep
file). Trials are the Cartesian product of the axes, the first axis varying slowest; trial ``i`` is array task
``i``. Values are strings, byte for byte as given: they fill ``{name}`` in the script's arguments and
``CLUSTERDDP_PARAM_NAME`` in its environment.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import re
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from .. import contract
from ..errors import SpecError
from ..job.array import ArrayTrial, JobArray
from ..job.quoting import shown

IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
#: A sweep's name is a directory name and a file name: short, printable, no path.
SWEEP_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
MAX_TRIALS = 100_000  # beyond any cluster's MaxArraySize; the cluster's own limit is checked at submit


@dataclass(frozen=True)
class Axis:
    """One dimension of the grid: one parameter (a grid) or several that vary together (a zip)."""

    names: Tuple[str, ...]
    values: Tuple[Tuple[str, ...], ...]  # one tuple per point, a value per name


@dataclass(frozen=True)
class Trial:
    index: int                           # its place in the grid: the array task id
    params: Tuple[Tuple[str, str], ...]  # (name, value), in the grid's order
    key: str                             # its identity: script, arguments, parameters, shape and code

    def args(self, args: Sequence[str]) -> List[str]:
        """The script's arguments with this trial's ``{name}``s filled in (the replacement is never read again)."""
        return [contract.fill_placeholders(a, dict(self.params)) for a in args]

    def env(self) -> List[Tuple[str, str]]:
        return [(contract.PARAM_PREFIX + name.upper(), value) for name, value in self.params]

    def record(self, sweep: str) -> Dict[str, Any]:
        """What the trial's run directory keeps in trial.json."""
        return {"sweep": sweep, "index": self.index, "key": self.key, "params": dict(self.params)}


def job_array(sweep: str, trials: Sequence[Trial], args: Sequence[str]) -> JobArray:
    """The job array of ``trials`` as the job and its batch script take it: each trial's variables, the script's
    ARGS with its values filled in, and its trial.json; built here, so that job/ never imports a sweep."""
    return JobArray(tuple(ArrayTrial(t.index, tuple(t.env()), tuple(t.args(args)),
                                     json.dumps(t.record(sweep), sort_keys=True)) for t in trials))


def check_sweep_name(name: str) -> str:
    if not SWEEP_NAME.match(name):
        raise SpecError(f"invalid sweep name {shown(name)}: expected letters, digits, '.', '_' or '-' (at most 64, "
                        "not starting with '.' or '-'), e.g. lr-search")
    return name


def _check_name(name: str, where: str) -> str:
    if not IDENTIFIER.match(name):
        raise SpecError(f"invalid parameter name {shown(name)} in {where}: expected an identifier (letters, digits, "
                        "'_', not starting with a digit), e.g. lr or batch_size")
    if name in contract.PLACEHOLDERS:
        raise SpecError(f"parameter name {name!r} in {where} is one of spawn's placeholders "
                        f"({', '.join(contract.PLACEHOLDERS)}): choose another name")
    return name


def _check_values(name: str, values: Sequence[str], where: str) -> Tuple[str, ...]:
    if not values or values == [""]:
        raise SpecError(f"empty grid for {name!r} in {where}: give at least one value, e.g. {name}=0.1,0.01")
    seen = set()
    for v in values:
        if v in seen:
            raise SpecError(f"duplicate value {shown(v)} for {name!r} in {where}: every trial would run twice")
        seen.add(v)
    return tuple(values)


def parse_grids(texts: Sequence[str]) -> List[Axis]:
    """``--grid NAME=V1,V2,...`` options -> axes (for values with commas in them, use a sweep file)."""
    axes = []
    for text in texts:
        name, eq, rest = text.partition("=")
        if not eq:
            raise SpecError(f"invalid --grid {shown(text)}: expected NAME=V1,V2,... e.g. --grid lr=0.1,0.01")
        _check_name(name, f"--grid {shown(text)}")
        axes.append(Axis((name,), tuple((v,) for v in _check_values(name, rest.split(","), "--grid"))))
    return axes


def _scalar(value: Any, where: str) -> str:
    """A TOML value as the string the script gets: strings as they are, numbers and booleans as TOML writes them."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, int, float)):
        return value if isinstance(value, str) else repr(value)
    raise SpecError(f"{where}: {shown(repr(value))} is not a string, number or boolean")


def _values(name: str, value: Any, where: str) -> List[str]:
    """A list, or a range {start, stop[, step]} (stop excluded, as Python's range)."""
    if isinstance(value, list):
        return [_scalar(v, f"{where}.{name}") for v in value]
    if isinstance(value, dict) and set(value) <= {"start", "stop", "step"} and "stop" in value:
        bounds = [value.get("start", 0), value["stop"], value.get("step", 1)]
        if not all(isinstance(b, int) and not isinstance(b, bool) for b in bounds) or bounds[2] == 0:
            raise SpecError(f"{where}.{name}: a range takes whole numbers start, stop and a step other than 0")
        values = range(*bounds)
        try:
            size: Optional[int] = len(values)
        except OverflowError:  # more values than an index can count
            size = None
        if size is None or size > MAX_TRIALS:  # sized before it is expanded: stop = 2**63 - 1 is refused, not listed
            raise SpecError(f"{where}.{name}: the range {{start = {bounds[0]}, stop = {bounds[1]}, step = "
                            f"{bounds[2]}}} has {size or 'too many'} values, more than "
                            f"clusterddp's limit of {MAX_TRIALS} trials")
        return [str(v) for v in values]
    raise SpecError(f"{where}.{name}: expected a list of values or a range {{start = 0, stop = 4}}, got "
                    f"{shown(repr(value))}")


def parse_file(data: Mapping[str, Any], where: str) -> List[Axis]:
    """A sweep file (TOML, read by the caller): ``[grid]`` NAME = [values] or {start, stop, step}; ``[zip]``
    NAME = [values], all of one length: they vary together, one axis."""
    unknown = sorted(set(data) - {"grid", "zip"})
    if unknown:
        raise SpecError(f"{where}: unknown table(s) {', '.join(map(repr, unknown))}: a sweep file has [grid] and "
                        "[zip]")
    for table in ("grid", "zip"):
        if not isinstance(data.get(table, {}), dict):
            raise SpecError(f"{where}: [{table}] is a table of NAME = [values] (e.g. [{table}] lr = [0.1, 0.01]), "
                            f"got {table} = {shown(repr(data[table]))[:80]}")
    axes = []
    for name, value in dict(data.get("grid", {})).items():
        _check_name(name, where)
        axes.append(Axis((name,), tuple((v,) for v in _check_values(name, _values(name, value, "[grid]"), where))))
    zipped = dict(data.get("zip", {}))
    if zipped:
        columns = {_check_name(n, where): _values(n, v, "[zip]") for n, v in zipped.items()}
        lengths = {n: len(v) for n, v in columns.items()}
        if len(set(lengths.values())) != 1:
            raise SpecError(f"{where}: the [zip] lists vary together and need one length; got "
                            f"{', '.join(f'{n}: {k}' for n, k in lengths.items())}")
        points = tuple(zip(*columns.values()))
        if not points:
            raise SpecError(f"{where}: empty [zip] lists")
        if len(set(points)) != len(points):
            raise SpecError(f"{where}: duplicate [zip] entries: every such trial would run twice")
        axes.append(Axis(tuple(columns), points))
    return axes


def check_axes(axes: Sequence[Axis]) -> None:
    if not axes:
        raise SpecError("a sweep needs at least one parameter: --grid NAME=V1,V2,... or --sweep-file FILE")
    names = [n for a in axes for n in a.names]
    for n in names:
        if names.count(n) > 1:
            raise SpecError(f"parameter {n!r} is given twice (each parameter is one axis of the grid)")
    upper = [n.upper() for n in names]
    for n in names:
        if upper.count(n.upper()) > 1:
            raise SpecError(f"parameters {' and '.join(repr(m) for m in names if m.upper() == n.upper())} would both "
                            f"be {contract.PARAM_PREFIX}{n.upper()}: rename one")


def check_placeholders(args: Sequence[str], axes: Sequence[Axis], launcher: str) -> None:
    """Every ``{name}`` in ARGS is a parameter (or, with the spawn launcher, one of its placeholders)."""
    names = {n for a in axes for n in a.names}
    allowed = names | (set(contract.PLACEHOLDERS) if launcher == "spawn" else set())
    for arg in args:
        for m in _PLACEHOLDER.finditer(arg):
            if m.group(1) not in allowed:
                raise SpecError(f"the script argument {shown(arg)} has the placeholder {{{m.group(1)}}}, which no "
                                f"grid defines (parameters: {', '.join(sorted(names))}); add --grid "
                                f"{m.group(1)}=..., or fix the spelling")


def count(axes: Sequence[Axis]) -> int:
    n = 1
    for a in axes:
        n *= len(a.values)
    return n


def trials(axes: Sequence[Axis], identity: Mapping[str, Any]) -> List[Trial]:
    """Every point of the grid as a Trial; ``identity`` (script, arguments, shape, code) goes into each key, so
    a trial is the same trial only for the same parameters with the same code."""
    check_axes(axes)
    total = count(axes)
    if total > MAX_TRIALS:
        raise SpecError(f"the grid has {total} trials, more than clusterddp's limit of {MAX_TRIALS}")
    out = []
    for index, point in enumerate(itertools.product(*(a.values for a in axes))):
        params = tuple((n, v) for axis, values in zip(axes, point) for n, v in zip(axis.names, values))
        blob = json.dumps({"params": params, **identity}, sort_keys=True)
        out.append(Trial(index, params, hashlib.sha256(blob.encode()).hexdigest()[:16]))
    return out
