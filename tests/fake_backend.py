"""A test-only backend (issue 24): the seam between the CLI and a scheduler, proved by plugging in one module
and one registry line. Its jobs live in a directory ($CLUSTERDDP_FAKE_BACKEND_DIR): submitted PENDING, run (the
training script, with this Python, in this process's working directory) the first time anyone asks about them,
so a cancel in between is seen; its log is a file like a batch log. What it leaves out (sweeps, stacks, the drill)
says so through the base class, in one line."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable, Sequence

from clusterddp.backends import BackendBase
from clusterddp.backends.jobinfo import JobInfo
from clusterddp.backends.record import JobRecord
from clusterddp.errors import JobNotFound


class FakeBackend(BackendBase):
    name = "fake"

    def __init__(self, cluster) -> None:
        self.cluster = cluster
        self.root = Path(os.environ["CLUSTERDDP_FAKE_BACKEND_DIR"])

    def _job(self, job_id: str) -> Path:
        return self.root / f"{job_id}.json"

    def script(self, spec, template_dirs: Sequence[str] = ()) -> str:
        """What submit writes for the job (its --dry-run)."""
        return json.dumps({"state": "PENDING", "argv": [spec.script, *spec.args], "cwd": os.getcwd()}) + "\n"

    def submit(self, spec, template_dirs: Sequence[str] = (), check: bool = True,
               note: Callable[[str], None] = lambda line: None) -> JobRecord:
        self.root.mkdir(parents=True, exist_ok=True)
        job_id = str(100 + len(list(self.root.glob("*.json"))))
        log = self.root / f"{spec.file_stem}-{job_id}.out"
        job = json.loads(self.script(spec, template_dirs))
        self._job(job_id).write_text(json.dumps({**job, "log": str(log)}))
        note(f"fake backend: job {job_id} queued")
        record = JobRecord(job_id=job_id, script_path=str(self._job(job_id)), batch_log=str(log),
                           run_dir=str(self.root / f"{spec.file_stem}-{job_id}"), launcher=spec.launcher,
                           procs_per_node=spec.tasks_per_node, nodes=spec.nodes, cluster=self.cluster.name,
                           python=spec.python)
        record.save()
        return record

    def info(self, job_id: str) -> JobInfo:
        path = self._job(job_id)
        if not path.exists():
            raise JobNotFound(f"job {job_id}: the fake backend never had it")
        job = json.loads(path.read_text())
        if job["state"] == "PENDING":
            with open(job["log"], "w") as log:
                proc = subprocess.run([sys.executable, *job["argv"]], cwd=job["cwd"], stdout=log,
                                      stderr=subprocess.STDOUT)
            job.update(state="COMPLETED" if proc.returncode == 0 else "FAILED", exit=proc.returncode)
            path.write_text(json.dumps(job))
        return JobInfo(job_id, job["state"], exit_code=job.get("exit"), nodes="1", node_list="fakenode")

    def wait(self, job_id: str, on_change: Callable[[JobInfo], None]) -> JobInfo:
        final = self.info(job_id)
        on_change(final)
        return final

    def cancel(self, job_id: str) -> None:
        path = self._job(job_id)
        job = json.loads(path.read_text())
        if job["state"] == "PENDING":
            job["state"] = "CANCELLED"
            path.write_text(json.dumps(job))

    def readable(self, record: JobRecord, reports_only: bool = False) -> JobRecord:
        return record

    def readable_file(self, path: str, job_id: str) -> Path:
        return Path(path)
