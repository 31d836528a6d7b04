"""Following a job from the login node: live states until it ends (--wait), its log as it grows (logs -f), and
the root cause of a failure. Login side; the CLI's commands call these."""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, Callable, List, Optional, Sequence, Tuple

import click

from ..backends.jobinfo import FAULT_STATES, JobState
from ..contract import EXIT
from ..job.ids import HERE
from . import goodput

#: The end states a fault class is looked for in (a cancelled job or one at its time limit had none).


def wait(backend: Any, job_id: str, on_interrupt: str, record: Optional[Any]) -> int:
    """Follow ``job_id`` of ``backend`` (--wait): its states as they change; its exit code, or 130 on Ctrl-C."""
    start = time.monotonic()

    def show(job: Any) -> None:
        where = f" on {job.node_list}" if job.state == JobState.RUNNING and job.node_list else ""
        why = f" ({job.reason})" if job.reason and job.reason not in ("None", "") and not job.done else ""
        click.echo(f"clusterddp: job {job_id} {job.state}{where}{why} [{time.monotonic() - start:.1f} s]", err=True)

    follower = _AttemptFollower(record)
    try:
        with follower:
            final = backend.wait(job_id, on_change=show)
        if not final.done:  # pending for a reason that never passes (jobinfo.NEVER_STARTS)
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
    if record is not None:
        reports = backend.readable(record, reports_only=True)
        follower.finish(reports)
        for line in goodput.lines(Path(reports.run_dir)):
            click.echo(f"clusterddp: {line}", err=True)
    if code != 0 and record is not None:
        readable = backend.readable(record)
        show_failure(readable)
        fault = fault_of(readable, final.node_list, final.state) if final.state in FAULT_STATES else None
        if fault is not None:
            click.echo(f"clusterddp: {fault.line()}", err=True)
            from ..healing.faults import INFRASTRUCTURE

            if fault.kind == INFRASTRUCTURE and fault.nodes:
                from ..healing import quarantine

                quarantine.add(record.cluster, fault.nodes, fault.why, record.job_id)
                click.echo(quarantine_note(fault.nodes, record.cluster), err=True)
    return code


class _AttemptFollower:
    """--wait: each attempt of the job's retry loop as it ends (a thread reading attempts.tsv of a job whose run
    directory is on this machine; a remote job's attempts come once it has ended), and the nodes at fault
    quarantined."""

    def __init__(self, record: Optional[Any]) -> None:
        import threading

        self.record, self.shown, self.stop = record, 0, threading.Event()
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "_AttemptFollower":
        if self.record is not None and self.record.cluster in ("", HERE):
            self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join(timeout=5)

    def _run(self) -> None:
        run_dir = Path(self.record.run_dir) if self.record is not None else None
        while run_dir is not None and not self.stop.wait(1.0):
            self._show(run_dir)

    def _show(self, run_dir: Path) -> List[Any]:
        """Print the attempts not shown yet: all of them once there is more than one or a fault."""
        from ..healing.attempts import read

        with self.lock:
            found = read(run_dir)
            for i, a in enumerate(found[self.shown:], start=self.shown):
                if a.fault or a.next != "end" or i > 0:
                    click.echo(f"clusterddp: {a.line()}", err=True)
            self.shown = max(self.shown, len(found))
            return found

    def finish(self, readable: Any) -> None:
        """The attempts not shown yet; the nodes at fault in any of them quarantined."""
        from ..healing import quarantine
        from ..healing.attempts import at_fault

        found = self._show(Path(readable.run_dir))
        held: List[str] = []
        for nodes, why in at_fault(found):
            held += quarantine.add(readable.cluster, nodes, why, readable.job_id)
        if held:
            click.echo(quarantine_note(sorted(set(held)), readable.cluster), err=True)


def quarantine_note(nodes: Sequence[str], cluster: str) -> str:
    from ..healing.quarantine import DEFAULT_SECONDS

    where = "" if cluster == HERE else f" --cluster {cluster}"
    return (f"clusterddp: quarantined {', '.join(nodes)}: later submissions leave it out for "
            f"{DEFAULT_SECONDS // 3600} h (clusterddp nodes{where}; clusterddp nodes --forget NODE{where})")


def fault_of(record: Any, node_list: str, state: str) -> Optional[Any]:
    """The fault class of a failed job (faults.classify) from its files as readable here (reads only)."""
    from ..healing.faults import classify
    from ..hostlist import expand

    try:
        nodes = expand(node_list) if node_list and node_list not in ("(null)", "None") else []
    except ValueError:
        nodes = []
    return classify(Path(record.run_dir), [Path(p) for p in record.logs()], Path(record.batch_log), nodes,
                    node_failed=state == JobState.NODE_FAIL, job=str(record.job_id),
                    launcher=str(getattr(record, "launcher", "") or ""))


def show_failure(record: Any) -> None:
    """The hang watchdog's roll call, or ranks that never arrived, or else every log with a traceback and the most
    likely root cause in full (``record``'s files readable here: Backend.readable)."""
    from ..healing.logscan import summary, tracebacks
    from ..rollcall import runtime_failure

    ended = runtime_failure(Path(record.run_dir))
    if ended is not None:
        click.echo(ended[1], err=True)
        return

    found = tracebacks([Path(p) for p in record.logs()] + [Path(record.batch_log)])
    click.echo(summary(found, f"{record.run_dir}/ and {record.batch_log}" if not found else record.run_dir), err=True)


def why_it_ended(backend: Any, job_id: str, cluster: str) -> str:
    """What the runtime reported for a job that ended: a hang's roll call in one line, a failed rendezvous."""
    from ..backends.record import JobRecord
    from ..rollcall import hang_report, rendezvous_failure

    record = JobRecord.load(job_id, cluster)
    if record is None:
        return ""
    record = backend.readable(record, reports_only=True)
    hang = hang_report(Path(record.run_dir))
    if hang is not None:
        return hang["summary"]
    return rendezvous_failure(Path(record.run_dir)) or ""


def job_faults(backend: Any, job_id: str, cluster: str, job: Any) -> Tuple[List[str], List[Tuple[Any, str]]]:
    """One job's history for ``status``: the attempt lines (once there is more than one or a fault), its fault line,
    and the (nodes, why) it blames on nodes. Reads only: ``status`` never quarantines (``nodes --from-job`` and
    ``submit --wait`` do)."""
    from ..backends.record import JobRecord
    from ..healing.attempts import at_fault, read
    from ..healing.attempts import lines as attempt_lines
    from ..healing.faults import INFRASTRUCTURE

    record = JobRecord.load(job_id, cluster)
    lines: List[str] = []
    blamed: List[Tuple[Any, str]] = []
    if record is None:
        return lines, blamed
    if job.done or backend.host is not None and backend.host.files_here:  # (a remote job's: once it ended)
        run_dir = Path(backend.readable(record, reports_only=True).run_dir)
        found = read(run_dir)
        if len(found) > 1 or any(a.fault for a in found):
            lines += attempt_lines(run_dir, found)
        blamed += at_fault(found)
        lines += goodput.lines(run_dir)
    if job.done and job.return_code and job.state in FAULT_STATES:
        fault = fault_of(backend.readable(record), job.node_list, job.state)
        if fault is not None:
            lines.append(fault.line())
            if fault.kind == INFRASTRUCTURE and fault.nodes:
                blamed.append((tuple(fault.nodes), fault.why))
    return lines, blamed


def not_quarantined(cluster: str, job_id: str, blamed: Sequence[Tuple[Any, str]]) -> str:
    """``status``'s hint when nodes a job blames are not (or no longer) quarantined ('' when they all are)."""
    from ..healing import quarantine

    held = quarantine.active(cluster)
    loose = sorted({n for nodes, _ in blamed for n in nodes if n not in held})
    if not loose:
        return ""
    where = "" if cluster == HERE else f" --cluster {cluster}"
    return (f"clusterddp: {', '.join(loose)} at fault in job {job_id} but not quarantined (status only reads): "
            f"clusterddp nodes --from-job {job_id}{where} leaves it out of later submissions")


def quarantine_job(job_id: str, chosen: Any) -> List[str]:
    """``nodes --from-job``: quarantine the nodes job ``job_id`` of cluster ``chosen`` blames (its attempts' node
    faults, its own fault class); returns them."""
    from .. import backends
    from ..healing import quarantine

    backend = backends.get(chosen)
    _, blamed = job_faults(backend, job_id, chosen.name, backend.info(job_id))
    held: List[str] = []
    for nodes, why in blamed:
        held += quarantine.add(chosen.name, nodes, why, job_id)
    return sorted(set(held))


def status_rows(targets: Sequence[Tuple[str, str]]) -> Tuple[List[Tuple[str, ...]], List[str], int]:
    """``status``'s table for (cluster, job id) pairs: its rows (a CLUSTER column when not all are here), the
    lines after it (one job: its attempts and its fault) and how many jobs could not be asked. One job, or one
    cluster that cannot be reached: the error itself (one line); of several, a row that says so."""
    from .. import backends
    from ..errors import JobNotFound, SlurmUnreachable, SpecError
    from ..job.clusters import by_name

    several = len({c for c, _ in targets}) > 1 or any(c != HERE for c, _ in targets)
    rows = [("CLUSTER",) * several + ("JOBID", "STATE", "ELAPSED", "NODES", "NODELIST", "EXIT", "REASON")]
    failed, unreachable, faults = 0, {}, []  # type: ignore[var-annotated]
    for name, job_id in targets:
        where = (name,) * several
        try:
            if name in unreachable:
                raise SlurmUnreachable(unreachable[name])
            backend = backends.get(by_name(name))
            j = backend.info(job_id)
            # A report file explains a failure; it never makes a job that ended well look failed.
            why = reason(j) if not j.done else why_it_ended(backend, job_id, name) if j.return_code else ""
        except JobNotFound as exc:
            if len(targets) == 1:
                raise
            rows.append(where + (job_id, "UNKNOWN", "", "", "", "", str(exc).split(":")[0]))
            failed += 1
            continue
        except (SlurmUnreachable, SpecError) as exc:
            if len({c for c, _ in targets}) == 1:
                raise  # one cluster: one line that says so (a listing of several goes on with the others)
            if name not in unreachable:  # said once, below the table (its "ways forward" are submit's)
                unreachable[name] = str(exc).splitlines()[0]
                faults.append(f"clusterddp: cluster {name!r}: {unreachable[name].split(' Ways forward:')[0]}")
            rows.append(where + (job_id, "UNREACHABLE", "", "", "", "", "its cluster cannot be asked (below)"))
            failed += 1
            continue
        exit_ = "" if j.exit_code is None else (f"{j.exit_code}" + (f" (signal {j.signal})" if j.signal else ""))
        rows.append(where + (j.job_id, j.state, j.elapsed, j.nodes, j.node_list, exit_, why))
        if len(targets) == 1:
            lines, blamed = job_faults(backend, job_id, name, j)
            faults += lines + [not_quarantined(name, job_id, blamed)]
    return rows, faults, failed


def local_status(run_dir: Path) -> Tuple[List[Tuple[str, ...]], List[str], int]:
    """``status RUN_DIR`` for a local run (no Slurm job behind it): a row from its recorded attempts (the last one
    decides), each attempt's line when there were several or a fault, and its goodput."""
    from ..healing.attempts import allocations, read
    from ..healing.attempts import lines as attempt_lines

    found = read(run_dir)
    running = any(a.end <= a.start for a in allocations(run_dir)) and not found
    last = found[-1] if found else None
    if last is None:
        state, exit_, elapsed, nodes = ("RUNNING" if running else "UNKNOWN"), "", "", ""
    else:
        state = "COMPLETED" if last.exit == 0 else "FAILED"
        exit_, nodes = str(last.exit), str(len(last.nodes))
        seconds = max(0, found[-1].end - found[0].start)
        elapsed = f"{seconds // 3600:d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"
    why = "" if last is None or last.exit == 0 else (last.why or last.fault)
    rows: List[Tuple[str, ...]] = [("RUN", "STATE", "ELAPSED", "NODES", "NODELIST", "EXIT", "REASON"),
                                   (str(run_dir), state, elapsed, nodes, ",".join(last.nodes) if last else "", exit_,
                                    why)]
    lines = attempt_lines(run_dir, found) if len(found) > 1 or any(a.fault for a in found) else []
    return rows, lines + goodput.lines(run_dir), int(state == "FAILED")


def reason(job: Any) -> str:
    never = job.never_starts
    return f"{job.reason}: {never} (clusterddp cancel {job.job_id})" if never else job.reason


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
        from ..errors import LogNotFound

        raise LogNotFound(f"log {path} is a symbolic link: not followed (logs are read as files of the job)")
    if not path.exists() and not follow:
        from ..errors import LogNotFound

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
