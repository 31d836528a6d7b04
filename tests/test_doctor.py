"""clusterddp doctor: a tiny job that checks the process group, interfaces and all-reduce speed."""
from __future__ import annotations

import json
import re

import pytest

from clusterddp.doctor import verdict

from .conftest import run_cli


@pytest.mark.ranks
def test_doctor_local(tmp_path):
    proc = run_cli("doctor", "--local", "--nodes", "2", "--procs-per-node", "2", cwd=tmp_path, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "world size 4 on 2 node(s), backend gloo" in proc.stdout
    assert len(re.findall(r"^[0-3] +\S+ +cpu +lo +127\.0\.0\.1", proc.stdout, re.M)) == 4
    assert re.search(r"^16 MiB +[0-9.]+ ms +[0-9.]+ GB/s", proc.stdout, re.M)
    assert "verdict: OK" in proc.stdout


def test_verdict_findings():
    base = {"world_size": 4, "nodes": 2, "backend": "gloo", "sum_ok": True, "allreduce": [],
            "ranks": [{"host": h, "hostname_ip": ip} for h, ip in
                      (("n1", "10.0.0.1"), ("n1", "10.0.0.1"), ("n2", "127.0.1.1"), ("n2", "127.0.1.1"))]}
    ok, problems = verdict(base)
    assert not ok and "hostname resolves to a loopback address" in problems[0] and "['n2']" in problems[0]
    assert verdict(dict(base, sum_ok=False, ranks=base["ranks"][:2]))[1][0] == "the all-reduce sum was wrong"
    assert verdict(base, local=True) == (True, [])


@pytest.mark.slurm
def test_doctor_on_the_test_cluster(slurm_env, tmp_path):
    proc = run_cli("doctor", "--nodes", "2", "--gpus", "2", cwd=tmp_path, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = re.findall(r"^([0-3]) +(node[12]) +cpu +(cddp-n[12]) +(10\.200\.0\.[12])", proc.stdout, re.M)
    assert sorted(rows) == [("0", "node1", "cddp-n1", "10.200.0.1"), ("1", "node1", "cddp-n1", "10.200.0.1"),
                            ("2", "node2", "cddp-n2", "10.200.0.2"), ("3", "node2", "cddp-n2", "10.200.0.2")]
    assert "verdict: OK: every rank joined" in proc.stdout


GOOD = {"world_size": 2, "nodes": 1, "backend": "gloo", "sum_ok": True,
        "ranks": [{"rank": r, "host": "n1", "local_rank": r, "route_ip": "127.0.0.1", "interface": "lo",
                   "hostname_ip": "127.0.1.1", "device": "cpu", "socket_ifname": None} for r in range(2)],
        "allreduce": [{"bytes": 4096, "latency_s": 0.001, "busbw_gbs": 1.5}]}


@pytest.mark.parametrize("hostile", [
    {**GOOD, "ranks": "x"},                              # once a KeyError / TypeError
    {**GOOD, "ranks": [{"host": "n1"}]},
    {**GOOD, "allreduce": [{"bytes": "big"}]},
    {**GOOD, "nodes": True},
    [1, 2],
])
def test_a_report_of_another_shape_is_no_report(hostile):
    """Issue 23, class 14: the report comes from a log (data); another shape is no report, never a traceback."""
    from clusterddp.doctor import format_report, parse

    assert parse("DOCTOR " + json.dumps(hostile)) is None
    assert parse("DOCTOR {not json") is None and parse("[" * 50000) is None
    good = parse("noise\nDOCTOR " + json.dumps({**GOOD, "backend": "gloo\x1b[2J"}) + "\n")
    assert good is not None and "gloo?[2J" in format_report(good, local=True)
