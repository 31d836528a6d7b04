"""``clusterddp stacks``: ask every rank of a running job where it is and print the roll call. Login side.

Ranks that use clusterddp.runtime answer through their control thread: this writes a request file in the run
directory and each rank writes its stacks beside it (no ptrace, no GPU, no collective). For the ranks that do not
answer (an unmodified script, a rank stuck in native code), ``py-spy dump`` is tried on their nodes, started with
``srun --overlap`` inside the job (or directly for a --local run); where that is not possible, one line says why.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .. import contract, rollcall
from ..contract import EXIT
from ..datafiles import parse_json, write_atomic
from ..errors import ClusterDDPError, SlurmError

FALLBACK_MODULE = "clusterddp.runtime.pyspy"


@dataclass(frozen=True)
class Target:
    """What is inspected: a run directory and, for a Slurm job, its id, nodes and rank layout."""

    run_dir: Path
    world_size: Optional[int] = None
    launcher: str = ""
    per_node: int = 1
    job_id: Optional[str] = None
    nodes: Sequence[str] = ()


def _node_guess(rank: int, target: Target, hellos: Dict[int, Dict[str, Any]]) -> str:
    per = target.per_node if target.job_id else next(
        (h["local_world_size"] for h in hellos.values() if isinstance(h.get("local_world_size"), int)), 1)
    index = rank // max(1, per)
    for r, h in hellos.items():
        if r // max(1, per) == index:
            return str(h.get("node", "?"))
    used = -(-target.world_size // max(1, per)) if target.world_size else len(target.nodes)
    if index < len(target.nodes) and len(target.nodes) == used:
        return target.nodes[index]
    # (more nodes than the ranks use: spares, and a retry may run on a part of them; not guessed)
    return f"node {index} of the attempt"


def _fallback(target: Target, directory: Path, timeout: float) -> str:
    """py-spy on every node for the ranks that gave no dump; '' or the reason it could not run."""
    argv = [sys.executable, "-m", FALLBACK_MODULE, str(target.run_dir.resolve()), str(directory.resolve())]
    from ..job.ids import is_local_job_id

    if target.job_id is None or is_local_job_id(target.job_id):
        # A local run: not the Slurm job this shell may sit in (the helper matches ranks by SLURM_JOB_ID there).
        env = {k: v for k, v in os.environ.items() if k not in ("SLURM_JOB_ID", "SLURMD_NODENAME")}
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout + 30, env=env)
        except subprocess.TimeoutExpired:
            return f"py-spy did not finish within {timeout + 30:.0f} s"
        return proc.stderr.strip().splitlines()[-1] if proc.returncode and proc.stderr.strip() else ""
    from ..backends.slurm import SlurmBackend

    try:  # where the files are: this machine's Slurm (a remote cluster's runs this module on its login node)
        proc = SlurmBackend().run_on_nodes(target.job_id, len(target.nodes) or 1, argv, timeout=timeout + 30)
    except SlurmError as exc:
        return f"srun --overlap could not start py-spy in job {target.job_id}: {str(exc).splitlines()[0]}"
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    return lines[-1] if proc.returncode and lines else ""


def collect(target: Target, timeout: float = 10.0, note: Callable[[str], None] = lambda line: None,
            fallback: bool = True) -> Dict[str, Any]:
    """Ask, wait up to ``timeout`` seconds for the answers, fall back to py-spy for the silent ranks, and return
    the roll call (rollcall.build's dict plus "dir" and "fallback"). Writes rollcall.txt/.json beside the dumps."""
    run_dir = target.run_dir
    if not run_dir.is_dir():
        raise ClusterDDPError(f"run directory {run_dir} does not exist (has the job started?)")
    name = time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"
    directory = run_dir / contract.DUMP_DIR.format(name=name)
    started = time.monotonic()
    try:
        directory.mkdir(parents=True)
        write_atomic(run_dir / contract.REQUEST_FILE, name + "\n")
    except OSError as exc:
        raise ClusterDDPError(f"cannot write the stack request into {run_dir}: {exc.strerror}") from None
    hellos = rollcall.read_hellos(run_dir)
    if target.world_size:  # the job's record says how many ranks there are: files claiming others are not its own
        hellos = {r: h for r, h in hellos.items() if r < target.world_size}
    world = target.world_size or max((h.get("world_size", 0) for h in hellos.values()), default=0)
    alive = {r for r, h in hellos.items() if h.get("state") != "left"}
    if alive:
        note(f"asked {len(alive)} rank(s) through the run directory; waiting up to {timeout:.0f} s")
        while time.monotonic() - started < timeout:
            answered = {int(n) for p in directory.glob("rank-*.json") if (n := p.stem[5:]).isdigit() and len(n) < 7}
            if alive <= answered:
                break
            time.sleep(0.2)
    dumps = [d for d in rollcall.read_dumps(directory) if not target.world_size or d["rank"] < target.world_size]
    reason = ""
    if fallback and len(dumps) < max(world, 1):
        note("ranks without an answer: trying py-spy on their nodes")
        reason = _fallback(target, directory, timeout)
        dumps = [d for d in rollcall.read_dumps(directory) if not target.world_size or d["rank"] < target.world_size]
    world = world or max((d["rank"] + 1 for d in dumps), default=0)
    answered = {d["rank"] for d in dumps}
    missing = {}
    for r in range(world):
        if r in answered:
            continue
        h = hellos.get(r)
        if h is None:
            missing[r] = f"{_node_guess(r, target, hellos)}: never started, or does not use clusterddp.runtime"
        elif h.get("state") == "left":
            missing[r] = f"{h.get('node', '?')}: finished (left the process group)"
        else:
            missing[r] = (f"{h.get('node', '?')}, pid {h.get('pid', '?')}: started ({h.get('state')}) but did not "
                          f"answer in {timeout:.0f} s: busy in native code holding Python's lock, stopped, or gone")
    call = rollcall.build(dumps, world, missing)
    call["dir"], call["fallback"] = str(directory), reason
    call["elapsed_s"] = round(time.monotonic() - started, 2)
    write_atomic(directory / "rollcall.json", json.dumps(call, indent=1))
    write_atomic(directory / "rollcall.txt", rollcall.format_text(call))
    return call


def nccl_traces(run_dir: Path) -> List[Path]:
    """PyTorch's NCCL flight-recorder dumps in the run directory (written on a timeout or a hang)."""
    return sorted((run_dir / contract.NCCL_TRACE_DIR).glob("rank_*"))


def report(call: Dict[str, Any], run_dir: Path) -> str:
    """The roll call as printed by ``clusterddp stacks``."""
    lines = [rollcall.format_text(call).rstrip("\n")]
    if call.get("fallback"):
        lines.append(f"py-spy fallback: {call['fallback']}")
    traces = nccl_traces(run_dir)
    if traces:
        lines.append(f"NCCL flight recorder: {len(traces)} dump(s) in {run_dir / contract.NCCL_TRACE_DIR}/ "
                     "(read them with: torchfrtrace "
                     f"{run_dir / contract.NCCL_TRACE_DIR} -p rank_)")
    lines.append(f"every rank's stacks: {call['dir']}/")
    return rollcall.printable("\n".join(lines) + "\n")  # dump files are data


def roll_call(job: str, cluster_option: Optional[str], timeout: float, fallback: bool,
              note: Callable[[str], None]) -> Tuple[Dict[str, Any], str]:
    """``clusterddp stacks JOB``: the roll call and its text, for a job id (its record gives the run directory;
    on a remote cluster it is collected on the login node), a --local run's id (L7) or its run directory."""
    from .. import backends, hostlist
    from ..backends.jobinfo import JobState
    from ..backends.record import locate

    job_id, run_dir, record, chosen = locate(job, cluster_option, "stacks",
                                             note=lambda line: note(f"clusterddp: {line}"))
    if job_id is None or record is None or chosen is None:
        target = Target(run_dir)
        call = collect(target, timeout, note=lambda line: note(f"clusterddp: {line}"), fallback=fallback)
        return call, report(call, target.run_dir)
    backend = backends.get(chosen)
    if backend.host is None:  # neither here nor on a login node of ours: nowhere to ask the ranks from
        raise backend.unsupported("asking a job's ranks for their stacks (clusterddp stacks)")
    info = backend.info(job_id)
    if info.state != JobState.RUNNING:
        raise ClusterDDPError(f"job {job_id} is {info.state}: only a running job has stacks to show"
                              + (f" (its logs: clusterddp logs {job_id})" if info.done else ""))
    target = Target(Path(record.run_dir), record.nodes * record.procs_per_node, record.launcher,
                    record.procs_per_node, job_id, hostlist.expand(info.node_list) if info.node_list else ())
    if not backend.host.files_here:  # its files are on the login node: asked there
        return _remote(backend, record.python, target, timeout, fallback, note)
    call = collect(target, timeout, note=lambda line: note(f"clusterddp: {line}"), fallback=fallback)
    return call, report(call, target.run_dir)


def _remote(backend: Any, python: str, target: Target, timeout: float, fallback: bool,
            note: Callable[[str], None]) -> Tuple[Dict[str, Any], str]:
    """The roll call of a remote job: collected on the login node (where the run directory is), by this
    clusterddp's own modules run with the job's Python there (``main`` below)."""
    cluster = backend.cluster

    args = [str(target.run_dir), "--world-size", str(target.world_size), "--launcher", target.launcher,
            "--per-node", str(target.per_node), "--job-id", str(target.job_id), "--nodes", ",".join(target.nodes),
            "--timeout", str(timeout)] + ([] if fallback else ["--no-py-spy"])
    note(f"clusterddp: asking job {target.job_id}'s ranks on cluster {cluster.name}")
    answer, wrong = module_answer(backend, python, "clusterddp.observe.stacks", args, 2 * timeout + 90, "stacks",
                                  note=lambda line: note(f"clusterddp: {cluster.name}: {line}"))
    call = answer.get("call")
    if not isinstance(call, dict) or not isinstance(call.get("groups"), list) \
            or not isinstance(answer.get("report"), str):  # a login node's answer is data: its shape is checked
        raise wrong
    return call, rollcall.printable(answer["report"])


def module_answer(backend: Any, python: str, module: str, args: List[str], timeout: float, command: str,
                  note: Callable[[str], None] = lambda line: None) -> Tuple[Dict[str, Any], SlurmError]:
    """``python -m MODULE ARGS`` on a remote cluster's login node (where a job's files are): its last line as a
    JSON object, its {"error": ...} raised as one line; with the error to raise when the caller finds the object
    of another shape (what a login node answers is data)."""
    name = backend.cluster.name
    proc = backend.run_module(python, module, args, timeout=timeout)
    for line in proc.stderr.splitlines():
        if line.strip():
            note(line)
    argv = ["python", "-m", module, *args]
    try:
        answer = parse_json(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise SlurmError(f"clusterddp {command} on cluster {name} gave no answer", argv, proc.returncode,
                         proc.stderr) from None
    if isinstance(answer, dict) and isinstance(answer.get("error"), str):
        raise ClusterDDPError(f"cluster {name}: {rollcall.printable(answer['error'])}")
    wrong = SlurmError(f"clusterddp {command} on cluster {name} gave an answer of another shape", argv,
                       proc.returncode, proc.stderr)
    if not isinstance(answer, dict):
        raise wrong
    return answer, wrong


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m clusterddp.observe.stacks RUN_DIR ...``: collect where the files are (a remote cluster's login
    node, for a clusterddp that asks over SSH) and print {"call": ..., "report": ...} (or {"error": ...}) as JSON."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m clusterddp.observe.stacks")
    p.add_argument("run_dir")
    p.add_argument("--world-size", type=int)
    p.add_argument("--launcher", default="")
    p.add_argument("--per-node", type=int, default=1)
    p.add_argument("--job-id")
    p.add_argument("--nodes", default="")
    p.add_argument("--timeout", type=float, default=10.0)
    p.add_argument("--no-py-spy", action="store_true")
    a = p.parse_args(argv)
    target = Target(Path(a.run_dir), a.world_size, a.launcher, a.per_node, a.job_id,
                    tuple(n for n in a.nodes.split(",") if n))
    try:
        call = collect(target, a.timeout, note=lambda line: print(line, file=sys.stderr, flush=True),
                       fallback=not a.no_py_spy)
    except ClusterDDPError as exc:
        print(json.dumps({"error": str(exc)}))
        return EXIT["RUNTIME"]
    print(json.dumps({"call": call, "report": report(call, target.run_dir)}))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
