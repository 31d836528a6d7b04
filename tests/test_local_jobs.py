"""Issue 56: a local run is a job like any other: an id users can type (L7), and status, logs, top, report, stacks
and cancel by it (real runs, real processes; the state is the runner's own record, checked against /proc)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from .conftest import SCRIPTS, run_cli
from .procs import descendants, state


def _env(tmp_path: Path) -> dict:
    return dict(os.environ, XDG_STATE_HOME=str(tmp_path / "state"))


def _job_id(stderr: str) -> str:
    line = next(line for line in stderr.splitlines() if line.startswith("clusterddp: local job L"))
    return line.split()[3]


def _wait_for(what, timeout: float = 60.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        found = what()
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"not within {timeout} s")


@pytest.mark.ranks
def test_a_local_run_is_a_job_by_its_id(tmp_path):
    env = _env(tmp_path)
    proc = run_cli("submit", "--local", "--launcher", "srun", "--nodes", "2", "--gpus", "2", str(SCRIPTS / "paced.py"),
                   "--", "--steps", "12", cwd=tmp_path, env=env)  # (the run directory: ./clusterddp-runs/...)
    assert proc.returncode == 0, proc.stderr
    job = _job_id(proc.stderr)
    assert job == "L1"
    assert f"next: clusterddp status {job}   clusterddp top {job}" in proc.stderr  # what to run next, by its id
    elsewhere = tmp_path / "another-terminal"  # (the id typed from another directory: the review found it lost)
    elsewhere.mkdir()
    status = run_cli("status", job, cwd=elsewhere, env=env)
    assert status.returncode == 0, status.stderr
    row = status.stdout.splitlines()[1].split()
    assert row[:4] == ["local", job, "COMPLETED", row[3]] and row[5:7] == ["local0,local1", "0"], status.stdout
    assert "goodput" in status.stdout
    listed = run_cli("status", cwd=tmp_path, env=env)  # the recent jobs, local runs among them
    assert listed.returncode == 0 and f" {job} " in listed.stdout, listed.stdout + listed.stderr
    logs = run_cli("logs", job, cwd=tmp_path, env=env)
    assert logs.returncode == 0 and "running on CPU with gloo" in logs.stdout, logs.stdout + logs.stderr
    rank0 = run_cli("logs", job.lower(), "--rank", "0", cwd=elsewhere, env=env)  # l1 is L1
    assert "FRESH start" in rank0.stdout and "DONE 12 steps" in rank0.stdout, rank0.stdout + rank0.stderr
    top = run_cli("top", job, "--json", cwd=elsewhere, env=env)
    assert top.returncode == 0, top.stderr
    assert sorted(r["rank"] for r in json.loads(top.stdout)["ranks"]) == [0, 1, 2, 3]
    report = run_cli("report", job, "-o", str(tmp_path / "r.html"), cwd=tmp_path, env=env)
    assert report.returncode == 0 and (tmp_path / "r.html").stat().st_size > 1000, report.stderr
    ended = run_cli("cancel", job, cwd=tmp_path, env=env)
    assert ended.returncode == 1 and f"local run {job} is not running (COMPLETED)" in ended.stderr, ended.stderr
    # (the next id: a torch-free script in one process is enough to be given it)
    again = run_cli("submit", "--local", "--launcher", "srun", "--output-dir", str(tmp_path / "runs"),
                    str(SCRIPTS / "sleeper.py"), "--", "0", cwd=tmp_path, env=env)
    assert again.returncode == 0 and _job_id(again.stderr) == "L2", again.stderr


@pytest.mark.ranks
def test_cancel_ends_a_running_local_run_and_every_rank(tmp_path):
    env = _env(tmp_path)
    runner = subprocess.Popen([sys.executable, "-m", "clusterddp", "submit", "--local", "--launcher", "torchrun",
                               "--nodes", "2", "--gpus", "2", "--output-dir", str(tmp_path / "runs"),
                               str(SCRIPTS / "paced.py"), "--", "--steps", "5000", "--step-s", "0.05"],
                              cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        def steps_recorded() -> bool:
            top = run_cli("top", "L1", "--json", cwd=tmp_path, env=env)
            return top.returncode == 0 and len(json.loads(top.stdout)["ranks"]) == 4
        _wait_for(steps_recorded, 120)
        running = run_cli("status", "L1", cwd=tmp_path, env=env)
        assert running.stdout.splitlines()[1].split()[2] == "RUNNING", running.stdout
        below = descendants(runner.pid)  # the agents and their ranks
        assert len(below) >= 6
        cancel = run_cli("cancel", "L1", cwd=tmp_path, env=env)
        assert cancel.returncode == 0 and "cancel requested for job L1" in cancel.stderr, cancel.stderr
        assert runner.wait(timeout=60) == 130
        _wait_for(lambda: all(state(p) in ("", "Z") for p in below), 20)  # every rank ended with it
        after = run_cli("status", "L1", cwd=tmp_path, env=env)
        row = after.stdout.splitlines()[1].split()
        assert row[2] == "CANCELLED" and row[6] == "130", after.stdout
        assert "interrupted; stopped all" in run_cli("logs", "L1", cwd=tmp_path, env=env).stdout
    finally:
        if runner.poll() is None:
            runner.send_signal(signal.SIGTERM)
            runner.wait(timeout=60)


@pytest.fixture
def filed(tmp_path, monkeypatch):
    """A local run's record and runner state as submit --local files them, its runner another process."""
    from clusterddp import JobSpec
    from clusterddp.backends.local import jobs

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    job = jobs.allocate()
    spec = JobSpec(script=str(SCRIPTS / "paced.py"), nodes=2, gpus_per_node=0, procs_per_node=2)
    jobs.started(job, str(run_dir), spec)
    return job, run_dir


def _rewrite(run_dir: Path, **fields) -> None:
    path = run_dir / "local-job.json"
    data = json.loads(path.read_text())
    data.update(fields)
    path.write_text(json.dumps(data))


def test_a_runner_gone_without_an_end_is_failed_and_a_reused_pid_is_never_signalled(filed):
    from clusterddp.backends.local import jobs
    from clusterddp.errors import ClusterDDPError

    job, run_dir = filed
    assert jobs.info(job).state == "RUNNING"  # its runner (this process, here) lives
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        # The pid of a living process that is not the runner (its start time differs): a pid reused.
        _rewrite(run_dir, pid=sleeper.pid)
        found = jobs.info(job)
        assert found.state == "FAILED" and "runner is gone without an end" in found.reason, found
        with pytest.raises(ClusterDDPError, match="is not running"):
            jobs.cancel(job)
        assert sleeper.poll() is None  # never signalled
        _rewrite(run_dir, host="another-login-node")
        assert "runs or ran on host another-login-node" in jobs.info(job).reason
    finally:
        sleeper.kill()
        sleeper.wait()
    jobs.ended(str(run_dir), 3)
    ended = jobs.info(job)
    assert (ended.state, ended.exit_code) == ("FAILED", 3)


def test_a_run_whose_directory_is_gone_is_missing_not_failed(filed):
    """(A run that completed, its directory then removed: what it became cannot be told, so it is not FAILED.)"""
    import shutil

    from clusterddp.backends.local import jobs

    job, run_dir = filed
    shutil.rmtree(run_dir)
    found = jobs.info(job)
    assert (found.state, found.exit_code) == ("MISSING", None), found
    assert found.reason == f"its run directory {run_dir} is not there (moved or removed)", found


def test_ids_are_unique_when_runs_start_together(tmp_path, monkeypatch):
    from clusterddp.backends.local import jobs

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    got: list = []
    threads = [threading.Thread(target=lambda: got.append(jobs.allocate())) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got, key=lambda j: int(j[1:])) == [f"L{n}" for n in range(1, 9)]


@pytest.mark.parametrize("argv,code,said", [
    (["status", "L0"], 2, "invalid job id 'L0'"),
    (["status", "Lx1"], 2, "invalid job id"),
    (["status", "L9"], 1, "no local run L9 here"),
    (["top", "L9"], 2, "no local run L9 here"),
    (["cancel", "L9"], 1, "no local run L9 here"),
    (["logs", "L3", "--cluster", "here"], 2, "L3 is a local run's id"),
])
def test_a_local_id_that_is_wrong_says_so(tmp_path, argv, code, said):
    from clusterddp.cli import cli

    from .conftest import cli_runner

    result = cli_runner().invoke(cli, argv, env={"XDG_STATE_HOME": str(tmp_path / "state")})
    assert result.exit_code == code and said in result.stderr, (result.exit_code, result.output)
    assert "Traceback" not in result.output


# Issue 79: these local jobs test what the ranks do, not their cold start (conftest.warm_start).
pytestmark = pytest.mark.usefixtures("warm_start")
