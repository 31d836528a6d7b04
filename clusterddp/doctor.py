"""``clusterddp doctor`` on the login side: run the doctor job, turn its ``DOCTOR {json}`` line into a report and a
verdict.

The job itself runs ``python -m clusterddp.runtime.doctor`` (clusterddp/runtime/doctor.py).
"""
from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

from .job.ids import HERE, LOCAL
from .rollcall import printable

if TYPE_CHECKING:
    from .job.clusters import Cluster
    from .job.spec import JobSpec

#: What the doctor job runs on every rank.
JOB_MODULE = "clusterddp.runtime.doctor"


def verdict(report: Dict[str, Any], local: bool = False) -> Tuple[bool, List[str]]:
    """(healthy, findings) for a DOCTOR report (``local``: emulated nodes share one host, by design)."""
    problems = []
    if not report.get("sum_ok"):
        problems.append("the all-reduce sum was wrong")
    hosts = {r["host"] for r in report["ranks"]}
    if report["nodes"] > 1 and not local:
        if len(hosts) < report["nodes"]:
            problems.append(f"{report['nodes']} nodes requested but ranks ran on {len(hosts)} host(s): {sorted(hosts)}")
        loop = [r for r in report["ranks"] if str(r["hostname_ip"]).startswith("127.")]
        if loop:
            problems.append(f"on {sorted({r['host'] for r in loop})} the hostname resolves to a loopback address: "
                            "ranks on other nodes may fail to connect; set GLOO_SOCKET_IFNAME / "
                            "NCCL_SOCKET_IFNAME to the interface of the cluster network")
    return (not problems), problems


def format_report(report: Dict[str, Any], local: bool = False) -> str:
    lines = [f"world size {report['world_size']} on {report['nodes']} node(s), backend {report['backend']}", "",
             f"{'rank':<6}{'host':<16}{'device':<10}{'interface':<14}{'address':<16}socket ifname env"]
    for r in report["ranks"]:
        lines.append(f"{r['rank']:<6}{r['host']:<16}{r['device']:<10}{str(r['interface']):<14}{r['route_ip']:<16}"
                     f"{r['socket_ifname'] or 'unset'}")
    lines += ["", f"{'all-reduce':<12}{'latency':>12}{'bus bandwidth':>16}"]
    for t in report["allreduce"]:
        size = f"{int(t['bytes']) >> 20} MiB" if t["bytes"] >= 1 << 20 else f"{int(t['bytes']) >> 10} KiB"
        lines.append(f"{size:<12}{t['latency_s'] * 1e3:>9.2f} ms{t['busbw_gbs']:>12.3f} GB/s")
    ok, problems = verdict(report, local)
    lines += ["", "verdict: OK: every rank joined, the all-reduce is correct" if ok else "verdict: PROBLEMS"]
    lines += [f"  - {p}" for p in problems]
    return "\n".join(lines) + "\n"


def parse(text: str) -> Optional[Dict[str, Any]]:
    """The report of a ``DOCTOR {json}`` line of the job's log, its shape checked (a log is data: another shape is
    no report, never a KeyError), every string made printable; None when there is none."""
    for line in text.splitlines():
        if "DOCTOR {" in line:
            try:
                data = json.JSONDecoder().raw_decode(line.split("DOCTOR ", 1)[1])[0]
            except (ValueError, RecursionError):
                continue
            report = _checked(data)
            if report is not None:
                return report
    return None


def _checked(data: Any) -> Optional[Dict[str, Any]]:
    def number(value: Any) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < 1e18

    def text(value: Any) -> Any:
        return printable(str(value))[:200] if value is not None else None

    if not isinstance(data, dict) or not all(number(data.get(k)) for k in ("world_size", "nodes")) \
            or not isinstance(data.get("ranks"), list) or not isinstance(data.get("allreduce"), list):
        return None
    ranks = []
    for r in data["ranks"][:100000]:
        if not isinstance(r, dict) or not number(r.get("rank")):
            return None
        ranks.append({"rank": int(r["rank"]), **{k: text(r.get(k)) or "?" for k in (
            "host", "device", "interface", "route_ip", "hostname_ip")}, "socket_ifname": text(r.get("socket_ifname"))})
    timings = [t for t in data["allreduce"][:100] if isinstance(t, dict) and all(
        number(t.get(k)) for k in ("bytes", "latency_s", "busbw_gbs"))]
    if len(timings) != len(data["allreduce"][:100]):
        return None
    return {"world_size": int(data["world_size"]), "nodes": int(data["nodes"]), "backend": text(data.get("backend")),
            "sum_ok": data.get("sum_ok") is True, "ranks": ranks,
            "allreduce": [{k: t[k] for k in ("bytes", "latency_s", "busbw_gbs")} for t in timings]}


def run_check(spec: "JobSpec", cluster: "Cluster", local: bool,
              note: Callable[[str], None] = lambda line: None) -> Tuple[int, Dict[str, Any]]:
    """Run the doctor job (``spec``) here (``local``) or on ``cluster``'s backend and wait for it; returns its exit
    code and its report. A job that ended without a report is a SlurmError carrying the end of its output."""
    from . import backends
    from .datafiles import read_bounded
    from .errors import SlurmError

    if local:
        lines: List[str] = []
        # (the doctor's time limit is Slurm's to enforce: a local check has none to ask for)
        code = backends.get(LOCAL).run(spec.replace(time=None), quiet=True, echo=lines.append, note=note)
        text = "\n".join(lines)
    else:
        backend = backends.get(cluster)
        record = backend.submit(spec, (), True, lambda line: note(f"clusterddp: {line}"))
        where = f" on cluster {cluster.name}" if cluster.name != HERE else ""
        note(f"clusterddp: doctor job {record.job_id} submitted{where}; waiting")
        code = backend.wait(record.job_id, lambda info: None).return_code
        log = backend.readable(record).rank_log(0)[0]
        raw = read_bounded(log, 16 << 20)  # the report is one line of a short log; never a link, never huge
        text = raw.decode("utf-8", "replace") if raw is not None else ""
    report = parse(text)
    if report is None:
        raise SlurmError(f"the doctor job ended (exit code {code}) without a report; its output:\n"
                         + printable(text[-3000:]))
    return code, report
