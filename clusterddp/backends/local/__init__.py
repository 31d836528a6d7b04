"""The local backend: the same job spec on this machine with no Slurm (plan.py builds the processes each launcher
would start, run.py starts and ends them). Its jobs run in the foreground: ``run`` returns the job's exit code. A
run given a job id (``submit --local`` gives each an ``L<n>``: jobs.py) is a job like a Slurm one for ``status``,
``logs``, ``top``, ``report`` and ``cancel``; what needs a queue (sweeps' arrays) says it is not supported here."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable, List, Optional, Sequence, Tuple

from ...job.clusters import Cluster
from ...job.ids import LOCAL
from .. import BackendBase
from ..hosts import Here

if TYPE_CHECKING:
    from ...job.spec import JobSpec
    from ..jobinfo import JobInfo
    from ..record import JobRecord


class LocalBackend(BackendBase):
    name = LOCAL

    def __init__(self, cluster: Optional[Cluster] = None) -> None:
        self.cluster = cluster or Cluster(LOCAL, backend=LOCAL)
        self.host = Here(self.cluster)

    def script(self, spec: "JobSpec", template_dirs: Sequence[str] = ()) -> str:
        """The processes a local run would start and their environment, as shell lines."""
        from .submit import dry_run

        return dry_run(spec)

    def not_applied(self, spec: "JobSpec") -> List[str]:
        from .plan import not_applied

        return not_applied(spec)

    def run(self, spec: "JobSpec", quiet: bool = False, echo: Callable[[str], None] = print,
            note: Callable[[str], None] = print, prepare: Callable[[str], object] = lambda run_dir: None,
            drill_env: Sequence[Tuple[str, str]] = (), run_dir: Optional[str] = None,
            job_id: Optional[str] = None) -> int:
        """Run ``spec`` here to its end (retries after an emulated node's fault included); its exit code.
        ``drill_env``: the drill's variables for its ranks (from this process's environment they are dropped);
        ``run_dir``: a run directory kept across runs (the drill's scenarios: run again there, as a requeued job is,
        with the next restart count), else a new one. ``job_id``: a local job id (jobs.allocate) to file the run
        under, so that it can be followed and cancelled by it."""
        from .plan import not_applied_line
        from .submit import submit_local

        line = not_applied_line(spec)
        if line:
            note(line)
        return submit_local(spec, quiet=quiet, echo=echo, note=note, prepare=prepare, drill_env=drill_env,
                            run_dir=run_dir, job_id=job_id)

    def submit(self, spec: "JobSpec", template_dirs: Sequence[str] = (), check: bool = True,
               note: Callable[[str], None] = lambda line: None) -> "JobRecord":
        raise self.unsupported("submitting to a queue (a local run is in the foreground: clusterddp submit --local)")

    def info(self, job_id: str) -> "JobInfo":
        from .jobs import info

        return info(job_id)

    def wait(self, job_id: str, on_change: Callable[["JobInfo"], None] = lambda info: None) -> "JobInfo":
        import time

        from .jobs import info

        last = None
        while True:
            now = info(job_id)
            if now.state != last:
                on_change(now)
                last = now.state
            if now.done:
                return now
            time.sleep(1.0)

    def cancel(self, job_id: str) -> None:
        from .jobs import cancel

        cancel(job_id)

    def readable(self, record: "JobRecord", reports_only: bool = False) -> "JobRecord":
        return record

    def readable_file(self, path: str, job_id: str) -> "Path":
        return Path(path)
