"""Issue 17, point 1: when Slurm cannot be reached, every command says so in one line, names what it tried and the
ways forward, and never calls a job unknown when Slurm was not asked. Real Slurm clients (22.05) against a missing
configuration and a controller that does not answer. (No Slurm on PATH: tests/test_cli.py.)"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from .conftest import CLUSTER_DIR, run_cli

pytestmark = pytest.mark.slurm

COMMANDS = [["submit", "train.py"], ["status", "123"], ["status"], ["cancel", "123"], ["logs", "456"]]


def check_one_line(proc, tried: str, said: str) -> None:
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("clusterddp: error: Slurm is not reachable from here: "), lines[0]
    assert tried in lines[0] and re.search(said, lines[0]), lines[0]
    assert "--local runs the job on this machine" in lines[0] and "unknown" not in lines[0]
    assert "Traceback" not in proc.stderr


@pytest.fixture
def laptop(slurm_env, tmp_path):
    (tmp_path / "train.py").write_text("print('hi')\n")
    state = tmp_path / "state" / "clusterddp" / "jobs"
    state.mkdir(parents=True)
    (state / "123.json").write_text('{"job_id": "123", "script_path": "x", "batch_log": "x.out", "run_dir": "x", '
                                    '"launcher": "srun", "procs_per_node": 1, "nodes": 1}')
    return tmp_path


@pytest.mark.parametrize("argv", COMMANDS)
def test_no_configuration(laptop, argv):
    missing = laptop / "nowhere" / "slurm.conf"
    env = {"SLURM_CONF": str(missing), "XDG_STATE_HOME": str(laptop / "state")}
    # timeout=30: Slurm's own clients would first spend a minute looking for DNS records
    proc = run_cli(*argv, cwd=laptop, env=_env(env), timeout=30)
    check_one_line(proc, f"SLURM_CONF={missing} is not a file", r"cannot know a cluster")


@pytest.mark.parametrize("argv", COMMANDS)
def test_a_controller_that_does_not_answer(laptop, argv):
    conf = Path(CLUSTER_DIR) / "slurm.conf"
    text = re.sub(r"^SlurmctldPort=\d+", "SlurmctldPort=16999", conf.read_text(), flags=re.M)  # nothing listens
    text = re.sub(r"^MessageTimeout=\d+", "MessageTimeout=2", text, flags=re.M)
    dead = laptop / "dead" / "slurm.conf"
    dead.parent.mkdir()
    dead.write_text(text)
    proc = run_cli(*argv, cwd=laptop, env=_env({"SLURM_CONF": str(dead), "XDG_STATE_HOME": str(laptop / "state")}),
                   timeout=200)
    check_one_line(proc, f"(with SLURM_CONF={dead})", r"Unable to contact slurm controller|did not answer")


def _env(extra: dict) -> dict:
    import os

    return dict(os.environ, **extra)
