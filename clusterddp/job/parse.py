"""Parsing what users type: Slurm time limits, ``KEY=VALUE``, file-name-safe names, typo suggestions, and the
bounds Slurm itself puts on counts and values. Pure functions; JobSpec (spec.py) validates with them."""
from __future__ import annotations

import re
from typing import Iterable, Tuple

from ..errors import SpecError
from .quoting import shown

#: slurmctld refuses longer strings in a job request ("Pathname ... too long", seen on 22.05).
SBATCH_VALUE_MAX = 1024
#: sbatch reads counts and minutes as 32-bit signed integers (22.05: -N 4294967294 is "not a valid node count").
MAX_COUNT = 2**31 - 1
MAX_TIME_S = MAX_COUNT * 60
_TIME_FORMATS = "MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS"


def suggest(given: str, valid: Iterable[str]) -> str:
    """' (did you mean X?)' when ``given`` looks like a typo of a valid name, else ''."""
    import difflib  # only on the error path

    close = difflib.get_close_matches(given, list(valid), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def parse_time(value: str) -> int:
    """Seconds in a Slurm time limit; accepts every format sbatch does (and UNLIMITED -> 0)."""
    text = str(value)  # as sbatch reads it: no spaces, ASCII digits (Python's \d takes "９")
    if text.upper() in ("UNLIMITED", "INFINITE"):
        return 0
    m = re.fullmatch(r"(?:([0-9]{1,9})-)?([0-9]{1,10})(?::([0-9]{1,10}))?(?::([0-9]{1,10}))?", text)
    if not m:
        raise SpecError(f"invalid time limit {value!r}: expected {_TIME_FORMATS} (e.g. 90, 02:00:00, 1-12)")
    days, a, b, c = m.groups()
    nums = [int(x) for x in (a, b, c) if x is not None]
    if days is not None:
        hours, minutes, seconds = (nums + [0, 0])[:3]
        if hours >= 24:
            raise SpecError(f"invalid time limit {value!r}: hours must be below 24 in D-HH forms")
        total = ((int(days) * 24 + hours) * 60 + minutes) * 60 + seconds
        sub = nums[1:]
    elif len(nums) == 1:
        total, sub = nums[0] * 60, []
    elif len(nums) == 2:
        total, sub = nums[0] * 60 + nums[1], nums[1:]
    else:
        total, sub = (nums[0] * 60 + nums[1]) * 60 + nums[2], nums[1:]
    if any(x >= 60 for x in sub):
        raise SpecError(f"invalid time limit {value!r}: minutes and seconds must be below 60")
    if total <= 0:
        raise SpecError(f"invalid time limit {value!r}: must be positive (use UNLIMITED for no limit)")
    if total > MAX_TIME_S:
        raise SpecError(f"invalid time limit {value!r}: Slurm accepts at most {MAX_TIME_S // 60} minutes; use "
                        "UNLIMITED for no limit")
    return total


def parse_env(items: Iterable[str]) -> Tuple[Tuple[str, str], ...]:
    """``["K=V", ...]`` -> ``(("K", "V"), ...)``, validating names; the value may hold anything but NUL."""
    out = []
    for item in items:
        if "=" not in item:
            raise SpecError(f"--env {shown(item)} has no '=': expected NAME=VALUE (e.g. --env NCCL_DEBUG=INFO)")
        name, value = item.split("=", 1)
        out.append((name, value))
    return tuple(out)


def slug(name: str) -> str:
    """A file-name-safe form of a job name: no '/', no '%' pattern, no leading dot."""
    s = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "job"
    return s[:100]


#: The longest pause, in seconds, between two looks at a followed job (slurm.wait backs off to it); set it lower
#: to see states sooner, higher to ask a busy controller less often.
POLL_MAX = "CLUSTERDDP_POLL_MAX"
POLL_MAX_DEFAULT, POLL_MAX_RANGE = 5.0, (0.5, 60.0)


def poll_max(raw: str) -> Tuple[float, str]:
    """CLUSTERDDP_POLL_MAX's seconds ('' for the default), and what was wrong with ``raw`` ('' when nothing): a
    bad value falls back to the default, since it is read only once the job is already submitted."""
    if not raw.strip():
        return POLL_MAX_DEFAULT, ""
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    low, high = POLL_MAX_RANGE
    if low <= value <= high:  # (NaN and inf fail)
        return value, ""
    return POLL_MAX_DEFAULT, (f"{POLL_MAX}={shown(raw)} is not a number of seconds from {low:g} to {high:g}; "
                              f"following the job with at most {POLL_MAX_DEFAULT:g} s between looks")
