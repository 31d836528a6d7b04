"""Issue 23, class 11: what a login node's Slurm prints is data. Stand-ins on PATH print what a hostile or broken
login node could (a real Slurm prints none of it): terminal escapes in status fields, a 300-digit job id, StdOut=/,
a node list of 10^8 hosts. Each is one line or a clean table; never a traceback, never an escape on the terminal."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from clusterddp.backends.jobinfo import JobInfo
from clusterddp.errors import HostlistError, SpecError
from clusterddp.hostlist import expand
from clusterddp.job.ids import check_job_id

from .conftest import ROOT


def standins(directory: Path, scripts: dict) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name in ("sbatch", "squeue", "sacct", "scontrol", "scancel", "sinfo", "srun"):
        body = scripts.get(name, 'echo "stand-in: no such job" >&2; exit 1')
        (directory / name).write_text(f"#!/bin/sh\n{body}\n")
        (directory / name).chmod(0o755)
    return directory


def cli(tmp_path: Path, scripts: dict, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "CLUSTERDDP_"))}
    env.update(PATH=f"{standins(tmp_path / 'bin', scripts)}{os.pathsep}{env['PATH']}", PYTHONPATH=str(ROOT),
               XDG_STATE_HOME=str(tmp_path / "state"), XDG_CONFIG_HOME=str(tmp_path / "config"),
               SLURM_CONF=str(tmp_path / "slurm.conf"))
    (tmp_path / "slurm.conf").write_text("ClusterName=x\n")
    return subprocess.run([sys.executable, "-m", "clusterddp", *args], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=60)


def test_escape_sequences_in_status_fields_never_reach_the_terminal(tmp_path):
    squeue = r"printf '7|RUNNING\033[2J|None\033]0;owned\007|00:01|1|node1\n'"
    proc = cli(tmp_path, {"squeue": squeue, "scontrol": "exit 1"}, "status", "7")
    assert proc.returncode == 0, proc.stderr
    assert "\x1b" not in proc.stdout + proc.stderr and "\x07" not in proc.stdout
    assert "RUNNING?[2J" in proc.stdout


def test_an_error_with_a_hostile_stderr_is_printable(tmp_path):
    proc = cli(tmp_path, {"scancel": r"printf 'denied \033]0;owned\007 here\n' >&2; exit 1",
                          "squeue": "printf '7|RUNNING|None|00:01|1|node1\\n'"}, "cancel", "7")
    assert proc.returncode == 1 and "\x1b" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_a_job_id_too_long_for_slurm_is_one_line(tmp_path):
    (tmp_path / "t.py").write_text("print(1)\n")
    proc = cli(tmp_path, {"sbatch": "echo " + "9" * 300, "sinfo": "exit 1"}, "submit", "--no-check", "--gpus", "0",
               "t.py")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "sbatch printed no job id" in proc.stderr
    with pytest.raises(SpecError):
        check_job_id("1" * 300)
    with pytest.raises(SpecError):
        check_job_id("4294967296")
    assert check_job_id("4294967295_4294967295") == "4294967295_4294967295"


def test_a_held_job_behind_an_unreadable_job_id_is_cancelled(tmp_path):
    """With checks on, the job is submitted held (released once its files are in place): an answer that is no job
    id would leave it held forever. The job is found by its script (squeue's command field) and cancelled."""
    (tmp_path / "t.py").write_text("print(1)\n")
    log = tmp_path / "calls.log"
    scripts = {
        "sbatch": (f'for a; do last="$a"; done; echo "sbatch $*" >> {log}; case "$*" in *--test-only*) '
                   f'echo "sbatch: Job 1 to start at now" >&2; exit 0;; esac; printf "%s" "$last" > {tmp_path}/script; '
                   'echo ' + "9" * 300),
        "squeue": f'echo "4242 /elsewhere/other.sbatch"; echo "4343 $(cat {tmp_path}/script)"',
        "scancel": f'echo "scancel $*" >> {log}',
        "sinfo": "printf 'debug*|1|infinite|(null)|4|8000|node1\\n'",
    }
    proc = cli(tmp_path, scripts, "submit", "--gpus", "0", "t.py")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "sbatch printed no job id" in proc.stderr and "the held job it queued (4343) was cancelled" in proc.stderr
    calls = log.read_text().splitlines()
    assert any("--hold" in c for c in calls) and calls[-1] == "scancel -- 4343", calls


def test_stdout_slash_is_no_log_path(tmp_path):
    assert JobInfo("7", "COMPLETED", stdout_path="/").stdout_path == ""
    assert JobInfo("7", "COMPLETED", stdout_path="rel/x.out").stdout_path == ""
    scontrol = "echo 'JobId=7 JobState=COMPLETED ExitCode=0:0 StdOut=/ NodeList=node1'"
    proc = cli(tmp_path, {"scontrol": scontrol, "squeue": "exit 1", "sacct": "exit 1"}, "logs", "7")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "no log path known for job 7" in proc.stderr


def test_a_huge_node_list_is_an_error_not_a_memory_error():
    with pytest.raises(HostlistError, match="more than"):
        expand(",".join(f"n{i}x[0-65535]" for i in range(100)))
