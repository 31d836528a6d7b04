"""Following a job from the login node: live states until it ends (--wait), its log as it grows (logs -f), and
the root cause of a failure. Login side; the CLI's commands call these."""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

import click

from .contract import EXIT

#: The end states a fault class is looked for in (a cancelled job or one at its time limit had none).
FAULT_STATES = ("FAILED", "NODE_FAIL")


def wait(backend: Any, job_id: str, on_interrupt: str, record: Optional[Any]) -> int:
    """Follow ``job_id`` of ``backend`` (--wait): its states as they change; its exit code, or 130 on Ctrl-C."""
    start = time.monotonic()

    def show(job: Any) -> None:
        where = f" on {job.node_list}" if job.state == "RUNNING" and job.node_list else ""
        why = f" ({job.reason})" if job.reason and job.reason not in ("None", "") and not job.done else ""
        click.echo(f"clusterddp: job {job_id} {job.state}{where}{why} [{time.monotonic() - start:.1f} s]", err=True)

    try:
        final = backend.wait(job_id, on_change=show)
        if not final.done:  # pending on a dependency that can no longer be met
            click.echo(f"clusterddp: {reason(final)}", err=True)
            return EXIT["RUNTIME"]
    except KeyboardInterrupt:
        choice = on_interrupt
        if choice == "ask":
            choice = "detach"
            if sys.stdin.isatty():
                choice = "cancel" if click.confirm(f"\nCancel job {job_id}?", default=False, err=True) else "detach"
        if choice == "cancel":
            backend.cancel(job_id)
            click.echo(f"clusterddp: cancelled job {job_id}", err=True)
        else:
            click.echo(f"clusterddp: stopped watching; job {job_id} goes on (clusterddp status {job_id})", err=True)
        return EXIT["INTERRUPTED"]
    code = final.return_code
    click.echo(f"clusterddp: job {job_id} ended {final.state}, exit code {code}", err=True)
    if code != 0 and record is not None:
        readable = backend.readable(record)
        show_failure(readable)
        fault = fault_of(readable, final.node_list, final.state) if final.state in FAULT_STATES else None
        if fault is not None:
            click.echo(f"clusterddp: {fault.line()}", err=True)
            from .faults import INFRASTRUCTURE
            from .quarantine import DEFAULT_SECONDS

            if fault.kind == INFRASTRUCTURE and fault.nodes:
                where = "" if record.cluster == "here" else f" --cluster {record.cluster}"
                click.echo(f"clusterddp: quarantined {', '.join(fault.nodes)}: later submissions leave it out for "
                           f"{DEFAULT_SECONDS // 3600} h (clusterddp nodes{where}; clusterddp nodes --forget "
                           f"NODE{where})", err=True)
    return code


def fault_of(record: Any, node_list: str, state: str) -> Optional[Any]:
    """The fault class of a failed job (faults.classify) from its files as readable here; a node at fault is
    quarantined on the job's cluster."""
    from . import quarantine
    from .faults import INFRASTRUCTURE, classify
    from .hostlist import expand

    try:
        nodes = expand(node_list) if node_list and node_list not in ("(null)", "None") else []
    except ValueError:
        nodes = []
    fault = classify(Path(record.run_dir), [Path(p) for p in record.logs()], Path(record.batch_log), nodes,
                     node_failed=state == "NODE_FAIL")
    if fault is not None and fault.kind == INFRASTRUCTURE and fault.nodes:
        quarantine.add(record.cluster, fault.nodes, fault.why, record.job_id)
    return fault


def show_failure(record: Any) -> None:
    """The hang watchdog's roll call, or ranks that never arrived, or else every log with a traceback and the most
    likely root cause in full (``record``'s files readable here: Backend.readable)."""
    from .logscan import summary, tracebacks
    from .rollcall import runtime_failure

    ended = runtime_failure(Path(record.run_dir))
    if ended is not None:
        click.echo(ended[1], err=True)
        return

    found = tracebacks([Path(p) for p in record.logs()] + [Path(record.batch_log)])
    click.echo(summary(found, f"{record.run_dir}/ and {record.batch_log}" if not found else record.run_dir), err=True)


def why_it_ended(backend: Any, job_id: str, cluster: str) -> str:
    """What the runtime reported for a job that ended: a hang's roll call in one line, a failed rendezvous."""
    from .record import JobRecord
    from .rollcall import hang_report, rendezvous_failure

    record = JobRecord.load(job_id, cluster)
    if record is None:
        return ""
    record = backend.readable(record, reports_only=True)
    hang = hang_report(Path(record.run_dir))
    if hang is not None:
        return hang["summary"]
    return rendezvous_failure(Path(record.run_dir)) or ""


def fault_line(backend: Any, job_id: str, cluster: str, node_list: str, state: str) -> str:
    """``status JOBID``'s fault line for a job that failed ('' when nothing tells)."""
    from .record import JobRecord

    record = JobRecord.load(job_id, cluster)
    if record is None:
        return ""
    fault = fault_of(backend.readable(record), node_list, state)
    return "" if fault is None else fault.line()


def reason(job: Any) -> str:
    if job.reason == "DependencyNeverSatisfied":
        # Slurm keeps such a job pending forever (unless kill_invalid_depend is set).
        return ("DependencyNeverSatisfied: a job it depends on failed, so it will never start "
                f"(clusterddp cancel {job.job_id})")
    return job.reason


def print_log(job_id: str, path_now: Callable[[], Path], prefix: Optional[str], follow: bool,
              done: Callable[[], bool]) -> None:
    """Print a log (``path_now()`` gives its path here, copying it from a remote cluster first), following it
    until the job ends (``done()``) with ``follow``."""
    def emit(chunk: str) -> None:
        if prefix is None:
            click.echo(chunk, nl=False)
        else:
            click.echo("".join(line for line in chunk.splitlines(True) if line.startswith(prefix)), nl=False)

    path = path_now()
    if path.is_symlink():  # a log is a file of the job's; a link (planted in a shared directory) is not followed
        from .errors import LogNotFound

        raise LogNotFound(f"log {path} is a symbolic link: not followed (logs are read as files of the job)")
    if not path.exists() and not follow:
        from .errors import LogNotFound

        raise LogNotFound(f"log {path} does not exist (yet): the job may still be pending; try clusterddp logs "
                          f"{job_id} --follow")
    pos, partial = 0, ""
    try:
        while True:
            if path.exists():
                with path.open("r", errors="replace") as fh:
                    fh.seek(pos)
                    text = partial + fh.read()
                    pos = fh.tell()
                # While following, hold back a half-written last line so prefixes are matched on whole lines.
                cut = text.rfind("\n") + 1 if follow else len(text)
                text, partial = text[:cut], text[cut:]
                if text:
                    emit(text)
            if not follow:
                if partial:
                    emit(partial)
                return
            if done():
                follow = False  # one more read: the last lines may land just after the state changes
            time.sleep(0.5)
            path = path_now()
    except KeyboardInterrupt:
        return
