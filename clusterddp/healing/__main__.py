"""``python -m clusterddp.healing next PHASE ...``: what the batch script asks its supervisor (supervise.py) at each
turn of its attempt loop (templates/base.sh.j2), and the records it keeps (attempts.tsv, the set-aside logs).

Phases: ``start`` (before the first attempt), ``gated`` (after a health gate), ``ended`` (after an attempt). The
answer, on stdout, is four lines (lines, not tabs: `read` merges tabs around an empty field): the action (gate, run,
requeue, end), its nodes (comma-separated), the nodes given no rank from now on, the exit code. Everything for people
goes to stderr (the batch log). A failure here is the script's to report: it ends the job, never retries blindly.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path
from typing import List, Optional, Sequence

from .. import contract
from ..datafiles import NotOwned, own_run_dir, read_bounded, write_atomic
from ..hostlist import expand, is_node_name
from ..rollcall import printable, runtime_failure
from . import attempts, faults, identity, supervise
from .supervise import Act, Action, FaultKind, Policy

TERM_WAIT_S = 2.0  # after a SIGTERM, how long srun's messages are read again for Slurm's word of a failed node

_MAX_HOSTS = 1 << 16


def _nodes(text: str) -> List[str]:
    """A comma-separated list of node names from the script (Slurm's own): names only, as data."""
    return [n for n in text.split(",")[:_MAX_HOSTS] if n and is_node_name(n)]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m clusterddp.healing next")
    p.add_argument("phase", choices=("start", "gated", "ended"))
    p.add_argument("--run-dir", required=True)
    p.add_argument("--hosts", required=True, help="the allocation's nodes, in order")
    p.add_argument("--bad", default="", help="nodes given no rank so far")
    p.add_argument("--restart", type=int, default=0)
    p.add_argument("--attempt", type=int, default=0)
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--per-node", type=int, default=1)
    p.add_argument("--retries", type=int, default=0)
    p.add_argument("--max-requeues", type=int, default=0)
    p.add_argument("--requeues", action="store_true")
    p.add_argument("--gate", action="store_true")
    p.add_argument("--exclude", default="", help="nodes excluded at submission (Slurm host lists)")
    p.add_argument("--partition", default="")
    p.add_argument("--status", type=int, default=0)
    p.add_argument("--signal", default="")
    p.add_argument("--start", type=int, default=0)
    p.add_argument("--ran-on", default="")
    p.add_argument("--trial", default="", help="start: a sweep trial's record, for RUN_DIR/trial.json")
    p.add_argument("--began", default="", help="start: when the batch script began (Unix time; the ledger's start)")
    p.add_argument("--launcher", default="", choices=("", "srun", "torchrun", "spawn"),
                   help="the job's launcher: whose own reports the evidence may hold (torchrun's only under torchrun)")
    return p


def _prepare(run_dir: Path, trial: str) -> Optional[str]:
    """The run directory before anything is written there: made, or checked as the job's own (datafiles.own_run_dir);
    a sweep's trial file (its record from the array task's arm). The refusal's line, or None."""
    try:
        own_run_dir(run_dir)
    except (NotOwned, OSError) as exc:
        return (f"clusterddp: the run directory {run_dir} is not this job's own ({exc}): refusing to use it; choose "
                "another --output-dir")
    if trial:
        write_atomic(run_dir / contract.TRIAL_FILE, trial + "\n")
    (run_dir / "health").mkdir(exist_ok=True)
    return None


def _slurm_word(step_err: Path, wait: Optional[float] = None) -> Optional[faults.Fault]:
    """Slurm's word of a failed node in srun's messages, waited for a moment after a SIGTERM: Slurm ends a job whose
    node failed and tells srun, and the SIGTERM can come first (CI, Slurm 26.05: recorded as a plain SIGTERM, the
    node never named). Within KillWait (5 s on the test cluster, 30 s by default)."""
    deadline = time.monotonic() + (TERM_WAIT_S if wait is None else wait)
    while True:
        lost = faults.slurm_lost_node(step_err)
        if lost is not None or time.monotonic() >= deadline:
            return lost
        time.sleep(0.2)


def _unrecorded_node_failure(run_dir: Path, restart: int, history: Sequence[attempts.Attempt]) -> None:
    """Slurm ends a job whose node failed and requeues it itself; the batch script it kills may not get to record
    that attempt (KillWait). At the next restart's start: Slurm's word in the last attempt's srun messages, recorded
    as that attempt's fault (node evidence), where nothing was recorded for it."""
    errs = []
    for path in run_dir.glob(contract.STEP_ERR.format(restarts=restart, attempt="*")):
        number = path.name[len(f"srun-{restart}."):-len(".err")]
        if number.isdigit():
            errs.append((int(number), path))
    if not errs:
        return
    attempt, err = max(errs)
    if any(a.restart == restart and a.attempt == attempt for a in history):
        return
    lost = faults.slurm_lost_node(err)
    if lost is None:
        return
    when = int(err.stat().st_mtime)
    attempts.append(run_dir, attempts.Attempt(restart, attempt, when, when, (), -1, str(lost.kind), lost.nodes,
                                              lost.why, contract.NEXT_REQUEUE, lost.evidence))
    print(f"clusterddp: restart {restart} was ended by Slurm for the failure of {','.join(lost.nodes)}, which it "
          "requeued itself (recorded now: that allocation's batch script was ended before it could)", file=sys.stderr)


def _slurm_requeues(action: Action, step_err: Path, policy: Policy) -> Action:
    """An end after Slurm's word of a failed node, which came before its SIGTERM (seen in CI on 26.05, sinfo then
    unanswered): Slurm ends this job and requeues it itself, as where the SIGTERM comes first: recorded so."""
    lost = faults.slurm_lost_node(step_err) if action.act == Act.END and policy.requeues else None
    if lost is None or action.fault is None or action.fault.kind != FaultKind.INFRASTRUCTURE:
        return action
    return action._replace(next=contract.NEXT_REQUEUE, say=(*action.say, (
        f"clusterddp: Slurm ends this attempt for the failure of {','.join(lost.nodes) or 'a node'}; it requeues "
        "the job itself, without that node")))


def _room(args: argparse.Namespace) -> Optional[supervise.Room]:
    raw = read_bounded(Path(args.run_dir) / contract.SINFO_FILE)
    return supervise.parse_room(args.partition, None if raw is None else raw.decode("utf-8", "replace"))


def _began(script: str) -> float:
    """When this allocation began: Slurm's own start (SLURM_JOB_START_TIME, set by newer releases; it counts the
    prolog) where it is a time not after the script's, else when the script began, else now."""
    now = time.time()
    mine = float(script) if re.fullmatch(r"[0-9]{1,11}(\.[0-9]{1,9})?", script) else now
    slurm = os.environ.get("SLURM_JOB_START_TIME", "")
    if re.fullmatch(r"[0-9]{1,11}", slurm) and mine - 3600 <= int(slurm) <= mine:
        return float(slurm)
    return min(mine, now)


def _record(args: argparse.Namespace, status: int, fault: Optional[faults.Fault], nxt: str, why: str = "",
            ran_on: Sequence[str] = (), start: int = 0) -> None:
    a = attempts.Attempt(args.restart, args.attempt, start or int(time.time()), int(time.time()), tuple(ran_on),
                         status, str(fault.kind) if fault else "", fault.nodes if fault else (),
                         fault.why if fault else why, nxt, fault.evidence if fault else "")
    attempts.append(Path(args.run_dir), a)


def _gated(args: argparse.Namespace, policy: Policy, hosts: List[str], bad: List[str],
           history: Sequence[attempts.Attempt]) -> Action:
    """Read the health gate's verdicts (a NODE.ok file per node that passed; its output in NODE.out)."""
    gate = Path(args.run_dir) / contract.HEALTH_DIR.format(restarts=args.restart, attempt=args.attempt)
    checked = [h for h in hosts if h not in bad]
    if checked and not any((gate / f"{host}.out").exists() or (gate / f"{host}.ok").exists() for host in checked):
        # No node's check even started: the gate's own srun failed (what it said, where the script kept it).
        raw = read_bounded(gate / "srun.err", 1 << 16)
        said = " ".join(raw.decode("utf-8", "replace").split("\n")[-3:]).strip() if raw else ""
        action = supervise.gate_not_run(history=history, policy=policy, hosts=hosts, bad=bad,
                                        why=printable(said[:200]) or "its srun started no task")
        _record(args, contract.EXIT["RUNTIME"], action.fault, action.next)
        return action
    failed = []
    for host in (h for h in hosts if h not in bad):
        if (gate / f"{host}.ok").is_file():
            continue
        raw = read_bounded(gate / f"{host}.out", 1 << 16)
        said = " ".join(raw.decode("utf-8", "replace").splitlines()[-2:]) if raw else ""
        print(printable(f"clusterddp: health gate: {host} gets no rank: {said}")[:400], file=sys.stderr)
        failed.append(host)
    action = supervise.after_gate(failed, history=history, policy=policy, hosts=hosts, bad=bad,
                                  restart=args.restart, room=_room(args))
    if action.act != Act.RUN:
        _record(args, contract.EXIT["RUNTIME"], action.fault, action.next)
    return action


def _ended(args: argparse.Namespace, policy: Policy, hosts: List[str], bad: List[str],
           history: Sequence[attempts.Attempt]) -> Action:
    run_dir, status, ran_on = Path(args.run_dir), args.status, _nodes(args.ran_on)
    # What the ranks' control thread found (a hang's roll call, or ranks that never arrived), this restart's, only
    # for a step that failed: the ranks' exit status decides, a file in the run directory only explains it.
    hang_dir = run_dir / contract.HANG_DIR.format(restarts=args.restart)
    if status != 0 and (hang_dir / "rollcall.txt").is_file():
        raw = read_bounded(hang_dir / "rollcall.txt") or b""
        limit = os.environ.get(contract.HANG_TIMEOUT, "?")
        print(printable(f"clusterddp: the hang watchdog ended the job: no rank advanced for "
                        f"{limit if limit.isdigit() else '?'} s. Roll call:\n{raw.decode('utf-8', 'replace').rstrip()}"
                        f"\nclusterddp: every rank's stacks: {hang_dir}/"), file=sys.stderr)
        status = contract.HANG_EXIT
    elif status != 0 and (run_dir / contract.RENDEZVOUS_REPORT.format(restarts=args.restart)).is_file():
        said = runtime_failure(run_dir)
        if said is not None:
            status = said[0]
            print(said[1], file=sys.stderr)
    record = dict(ran_on=ran_on, start=args.start)
    if args.signal == "USR2":
        if args.restart >= policy.max_requeues:
            _record(args, status, None, contract.NEXT_END, "time limit", **record)
            print(f"clusterddp: requeue limit reached ({args.restart} of {policy.max_requeues} requeues used): the job "
                  "ends here with its last checkpoint; submit it again to continue", file=sys.stderr)
            return Action(Act.END, (), tuple(bad), contract.EXIT["REQUEUE_LIMIT"])
        _record(args, status, None, contract.NEXT_REQUEUE, "time limit", **record)
        return Action(Act.REQUEUE, (), tuple(bad))
    step_err = run_dir / contract.STEP_ERR.format(restarts=args.restart, attempt=args.attempt)
    if args.signal == "TERM":
        lost = _slurm_word(step_err)
        if lost is None and status != 0 and policy.retries and policy.requeues:
            # srun ended before it wrote Slurm's word: Slurm's own state of the nodes, as the batch script wrote it
            # after srun (base.sh.j2 clusterddp_room, with retries and requeues on; else the file is not this attempt's)
            lost = faults.slurm_down(run_dir / contract.SINFO_FILE, ran_on, args.start)
        if lost is not None:  # Slurm ends a job whose node failed (and requeues it itself, where it may)
            nxt = contract.NEXT_REQUEUE if policy.requeues else contract.NEXT_END
            print(f"clusterddp: Slurm ended this attempt for the failure of {','.join(lost.nodes) or 'a node'}"
                  + ("; it requeues the job itself, without that node" if policy.requeues else
                     "; requeue is off (--time or --requeue turns it on): the job ends"), file=sys.stderr)
            _record(args, status, lost, nxt, **record)
            return Action(Act.END, (), tuple(bad), status)
    if args.signal or status == 0 or not policy.retries:
        if args.signal == "TERM":
            print("clusterddp: terminated (preempted or cancelled): not requeueing here; the last checkpoint is kept",
                  file=sys.stderr)
        _record(args, status, None, contract.NEXT_END, f"SIG{args.signal}" if args.signal else "", **record)
        return Action(Act.END, (), tuple(bad), status)
    fault = faults.attempt(run_dir, step_err, ran_on, policy.per_node, os.environ.get("SLURM_JOB_ID", ""), args.start,
                           restart=args.restart, launcher=args.launcher)
    print(f"clusterddp: attempt {args.attempt + 1} failed: {fault.line()}", file=sys.stderr)
    action = supervise.after_failure(fault, history=history, policy=policy, hosts=hosts, bad=bad, ran_on=ran_on,
                                     restart=args.restart, room=_room(args), exit_code=status)
    action = _slurm_requeues(action, step_err, policy)
    _record(args, status, action.fault, action.next, **record)
    if action.act in (Act.GATE, Act.RUN):
        # This attempt's logs and reports move aside: the next one starts with fresh ones (and its fault report
        # reads only its own).
        kept = attempts.set_aside(run_dir, args.restart, args.attempt)
        print(f"clusterddp: the failed attempt's logs and reports: {kept}/", file=sys.stderr)
    return action


def main(argv: Sequence[str]) -> int:
    if argv and argv[0] == "gate" and len(argv) in (2, 3):
        from .gate import check

        return check(Path(argv[1]), argv[2] if len(argv) == 3 else "")
    if not argv or argv[0] != "next":
        print("usage: python -m clusterddp.healing next {start,gated,ended} ... | gate DIR [CHECK]", file=sys.stderr)
        return 2
    args = _parser().parse_args(argv[1:])
    try:
        return _next(args)
    except Exception as exc:  # one line for the batch log; the script ends the job (nothing retried blindly)
        print(printable(f"clusterddp: the supervisor failed: {type(exc).__name__}: {exc}")[:500], file=sys.stderr)
        return 1


def _next(args: argparse.Namespace) -> int:
    """Decide, print the answer."""
    exclude = []
    for word in args.exclude.split(",")[:_MAX_HOSTS] if args.exclude else []:
        try:
            exclude.extend(expand(word)[:_MAX_HOSTS])
        except ValueError:  # (checked at submission: a host list Slurm took)
            exclude.append(word)
    policy = Policy(args.nodes, args.per_node, args.retries, args.requeues, args.max_requeues, args.gate,
                    tuple(n for n in exclude if is_node_name(n)))
    hosts = list(dict.fromkeys(_nodes(args.hosts)))
    bad = _nodes(args.bad)
    history = attempts.read(Path(args.run_dir))
    if args.phase == "start":
        refused = _prepare(Path(args.run_dir), args.trial)
        if refused:
            print(refused, file=sys.stderr)
            print(f"end\n\n\n{contract.EXIT['RUNTIME']}")
            return 0
        # A new job's identity for the trackers (runtime.run_id()): another job's with this path is replaced
        identity.write(Path(args.run_dir), *identity.of_slurm(), args.restart)
        attempts.began(Path(args.run_dir), args.restart, _began(args.began), hosts)
        if args.restart > 0:  # the last restart's logs aside: this restart's evidence is its own (srun appends)
            _unrecorded_node_failure(Path(args.run_dir), args.restart - 1, history)
            attempts.set_aside_logs(Path(args.run_dir), args.restart - 1)
        chosen = supervise.choose(hosts, bad, policy.nodes)
        if policy.gate:
            action = Action(Act.GATE, tuple(h for h in hosts if h not in bad), tuple(bad))
        elif chosen is not None:
            action = Action(Act.RUN, chosen, tuple(bad))
        else:
            action = Action(Act.END, (), tuple(bad), contract.EXIT["RUNTIME"],
                            (f"clusterddp: the allocation has {len(hosts)} node(s), the job needs {policy.nodes}",))
    elif args.phase == "gated":
        action = _gated(args, policy, hosts, bad, history)
    else:
        action = _ended(args, policy, hosts, bad, history)
    for line in action.say:
        print(line, file=sys.stderr)
    print(f"{action.act}\n{','.join(action.nodes)}\n{','.join(action.bad)}\n{action.exit}")
    return 0


if __name__ == "__main__":
    sys.exit(main([re.sub(r"[\r\n]", " ", a) for a in sys.argv[1:]]))
