import shutil
import subprocess
from typing import List, Sequence, Tuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clusterddp.hostlist import _SEPARATORS, _TRAILING_NUM, MAX_RANGE, HostlistError, expand, first, iter_hosts


def compress(hosts: Sequence[str]) -> str:
    """The reverse of clusterddp.hostlist.expand, for the round-trip tests (clusterddp itself never compresses):
    ``expand(compress(h)) == list(h)`` for every valid list.

    Adjacent names that differ only in their last number are merged into one bracket group; order and
    duplicates are kept (so a compressed list may be longer than Slurm's sorted form).
    """
    out: List[str] = []
    group_key: Tuple[str, str] | None = None
    ranges: List[Tuple[int, int, str]] = []  # (low, high, low as written)

    def flush() -> None:
        if group_key is None:
            return
        prefix, suffix = group_key
        if len(ranges) == 1 and ranges[0][0] == ranges[0][1]:
            out.append(f"{prefix}{ranges[0][2]}{suffix}")
        else:
            body = ",".join(s if lo == hi else f"{s}-{str(hi).zfill(len(s))}" for lo, hi, s in ranges)
            out.append(f"{prefix}[{body}]{suffix}")

    for host in hosts:
        if not host or any(c in host for c in "[]" + _SEPARATORS):
            raise HostlistError(f"host name {host!r} cannot appear in a host list")
        m = _TRAILING_NUM.match(host)
        if not m:
            flush()
            group_key, ranges = None, []
            out.append(host)
            continue
        prefix, num, suffix = m.groups()
        n = int(num)
        if (prefix, suffix) == group_key:
            lo, hi, lo_s = ranges[-1]
            if n == hi + 1 and str(n).zfill(len(lo_s)) == num:
                ranges[-1] = (lo, n, lo_s)
                continue
            ranges.append((n, n, num))
            continue
        flush()
        group_key, ranges = (prefix, suffix), [(n, n, num)]
    flush()
    return ",".join(out)


@pytest.mark.parametrize("text,hosts", [
    ("node1", ["node1"]),
    ("node[1-3]", ["node1", "node2", "node3"]),
    ("node[001-003]", ["node001", "node002", "node003"]),
    ("n[9-11]", ["n9", "n10", "n11"]),
    ("n[09-11]", ["n09", "n10", "n11"]),
    ("rack[1-2]-node[01-02]", ["rack1-node01", "rack1-node02", "rack2-node01", "rack2-node02"]),
    ("node[1-2].cluster.local", ["node1.cluster.local", "node2.cluster.local"]),
    ("node[1-2]-ib", ["node1-ib", "node2-ib"]),
    ("a,b[1,3-4],c", ["a", "b1", "b3", "b4", "c"]),
    ("a b,c", ["a", "b", "c"]),
    ("n[2-3],n[1-2]", ["n2", "n3", "n1", "n2"]),
    ("", []),
])
def test_expand(text, hosts):
    assert expand(text) == hosts


@pytest.mark.parametrize("text,part", [
    ("n[", "unclosed '['"), ("n[]", "empty brackets"), ("n[3-1]", "'3-1'"), ("node[a-c]", "'a-c'"),
    ("n]", "unmatched ']'"), ("n[[1]]", "nested"), (f"n[1-{MAX_RANGE + 1}]", "at most 65536"), ("n[1-2,]", "''"),
])
def test_malformed_lists_name_the_bad_part(text, part):
    with pytest.raises(HostlistError) as exc:
        expand(text)
    assert part in str(exc.value)
    assert isinstance(exc.value, ValueError)


def test_first_does_not_expand_the_rest():
    assert first("node[0042-65000],x") == "node0042"
    assert first("a[5-6]b[7-8]") == "a5b7"
    # A malformed tail is not even looked at: first() stops at the first expression.
    assert first("good1,bad[") == "good1"
    with pytest.raises(HostlistError):
        first("")
    gen = iter_hosts("n[1-65536]")
    assert next(gen) == "n1"


def test_max_range_is_allowed():
    assert len(expand(f"n[1-{MAX_RANGE}]")) == MAX_RANGE


def test_compress_examples():
    assert compress(["n1", "n2", "n3", "x"]) == "n[1-3],x"
    assert compress(["n01", "n02", "n10"]) == "n[01-02,10]"
    assert compress(["a"]) == "a"
    with pytest.raises(HostlistError):
        compress(["bad,name"])


names = st.from_regex(r"[a-z]{1,3}[0-9]{0,3}(-[a-z]{1,2}[0-9]{0,2})?", fullmatch=True)


@settings(max_examples=300, deadline=None)
@given(st.lists(names, min_size=1, max_size=30))
def test_compress_roundtrip(hosts):
    assert expand(compress(hosts)) == hosts


bracket = st.tuples(st.integers(0, 30), st.integers(0, 5), st.integers(1, 3)).map(
    lambda t: f"{str(t[0]).zfill(t[2])}-{t[0] + t[1]}" if t[1] else str(t[0]).zfill(t[2]))
expr = st.tuples(st.from_regex(r"[a-z]{1,4}", fullmatch=True), st.lists(bracket, min_size=1, max_size=3),
                 st.sampled_from(["", "-ib"])).map(lambda t: f"{t[0]}[{','.join(t[1])}]{t[2]}")
hostlists = st.lists(expr, min_size=1, max_size=3).map(",".join)


@settings(max_examples=200, deadline=None)
@given(hostlists)
def test_expand_properties(text):
    hosts = expand(text)
    assert hosts and hosts[0] == first(text)
    assert expand(compress(hosts)) == hosts


def _scontrol_hostnames(text, env):
    return subprocess.run(["scontrol", "show", "hostnames", text], capture_output=True, text=True, env=env,
                          timeout=30)


@pytest.mark.slurm
def test_matches_scontrol_on_random_lists(slurm_cluster):
    """The real scontrol (22.05) agrees on every list it accepts (it rejects text after brackets)."""
    if not shutil.which("scontrol"):
        pytest.skip("scontrol not installed")
    import random

    rng = random.Random(1234)
    checked = 0
    for _ in range(60):
        parts = []
        for _ in range(rng.randint(1, 3)):
            prefix = rng.choice(["node", "gpu", "rack1-n", "x"])
            ranges = []
            for _ in range(rng.randint(1, 3)):
                lo, width = rng.randint(0, 120), rng.randint(1, 4)
                hi = lo + rng.randint(0, 12)
                ranges.append(str(lo).zfill(width) if lo == hi else f"{str(lo).zfill(width)}-{hi}")
            parts.append(f"{prefix}[{','.join(ranges)}]" if rng.random() < 0.8 else f"{prefix}{lo}")
        text = ",".join(parts)
        out = _scontrol_hostnames(text, slurm_cluster)
        assert out.returncode == 0, out.stderr
        assert expand(text) == out.stdout.split(), text
        checked += 1
    two = "rack[1-2]-node[01-03]"
    assert expand(two) == _scontrol_hostnames(two, slurm_cluster).stdout.split()
    assert checked == 60
