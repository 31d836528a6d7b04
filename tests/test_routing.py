"""Issue 22: a job id finds its cluster. ``status``, ``logs``, ``cancel`` and ``stacks`` with an id and no
``--cluster`` use the cluster whose records hold it; several -> refused naming them; none -> the default. Slurm's
commands on PATH are recording stand-ins, so a local Slurm command that should not run is seen. (With the real
test cluster over SSH: tests/test_remote.py::test_a_job_id_finds_its_cluster.)"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import ROOT

SLURM_COMMANDS = ("sbatch", "squeue", "sacct", "scontrol", "scancel", "srun", "sinfo")


def recording_standins(directory: Path, log: Path) -> Path:
    """Slurm's commands as stand-ins that only write their argv to ``log`` and fail."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in SLURM_COMMANDS:
        path = directory / name
        path.write_text(f'#!/bin/sh\necho "{name} $*" >> "{log}"\necho "stand-in {name}: no Slurm here" >&2\n'
                        "exit 1\n")
        path.chmod(0o755)
    return directory


def plant_record(state: Path, cluster: str, job_id: str, tmp: Path) -> None:
    d = state / "clusterddp" / "jobs" / cluster
    d.mkdir(parents=True, exist_ok=True)
    record = {"job_id": job_id, "script_path": str(tmp / f"{cluster}.sbatch"), "batch_log": str(tmp / "b.out"),
              "run_dir": str(tmp / "run"), "launcher": "srun", "procs_per_node": 1, "nodes": 1}
    (d / f"{job_id}.json").write_text(json.dumps(record))


@pytest.fixture
def laptop(tmp_path):
    """A project whose user config defines cluster hpc (a host that refuses connections), Slurm's commands on
    PATH recording what runs; returns (project, env, log of Slurm commands run here, state dir)."""
    log = tmp_path / "slurm-commands.log"
    standins = recording_standins(tmp_path / "bin", log)
    config = tmp_path / "xdg" / "clusterddp"
    config.mkdir(parents=True)
    (config / "config.toml").write_text('[clusters.hpc]\nhost = "127.0.0.1"\nport = 1\n')
    proj = tmp_path / "proj"
    proj.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "CLUSTERDDP_"))}
    env.update(XDG_CONFIG_HOME=str(tmp_path / "xdg"), XDG_STATE_HOME=str(tmp_path / "state"),
               PATH=f"{standins}{os.pathsep}{env['PATH']}", PYTHONPATH=str(ROOT))
    env.pop("XDG_RUNTIME_DIR", None)
    return proj, env, log, tmp_path / "state"


def cli(*args: str, cwd: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "clusterddp", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=60)


def ran_here(log: Path) -> str:
    return log.read_text() if log.exists() else ""


@pytest.mark.parametrize("argv", [["status", "7"], ["logs", "7"], ["logs", "7", "--rank", "0"], ["cancel", "7"],
                                  ["stacks", "7"], ["status", "7_3"]])
def test_a_job_recorded_on_a_remote_cluster_goes_there(laptop, argv):
    """Only cluster hpc has job 7: the command goes there (its host refuses: the ssh failure is the answer), says
    so in one line, and no Slurm command of this machine runs."""
    proj, env, log, state = laptop
    plant_record(state, "hpc", "7", proj)
    proc = cli(*argv, cwd=proj, env=env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "clusterddp: job 7 is on cluster hpc (from clusterddp's record of it; --cluster chooses another)" \
        in proc.stderr.splitlines() or argv[1] == "7_3"
    assert "cannot log in to cluster 'hpc' (ssh 127.0.0.1): the host does not answer" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert ran_here(log) == ""


@pytest.mark.parametrize("command", ["status", "logs", "cancel", "stacks"])
def test_the_same_id_on_two_clusters_is_refused(laptop, command):
    proj, env, log, state = laptop
    plant_record(state, "hpc", "12", proj)
    plant_record(state, "here", "12", proj)
    proc = cli(command, "12", cwd=proj, env=env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip() == ("clusterddp: error: job 12 is recorded on several clusters (here, hpc): choose "
                                   "one with --cluster NAME, e.g. --cluster here")
    assert ran_here(log) == ""
    chosen = cli(command, "12", "--cluster", "hpc", cwd=proj, env=env)  # --cluster decides
    assert "cannot log in to cluster 'hpc'" in chosen.stderr and ran_here(log) == "", chosen.stderr


def test_a_job_recorded_here_and_an_unknown_one_ask_this_machines_slurm(laptop):
    """A record of 'here' (or none at all) leaves the choice as before: this machine's Slurm, silently."""
    proj, env, log, state = laptop
    plant_record(state, "here", "5", proj)
    for job in ("5", "99"):
        log.unlink(missing_ok=True)
        proc = cli("cancel", job, cwd=proj, env=env)
        assert proc.returncode == 1 and "is on cluster" not in proc.stderr, proc.stderr
        assert f"--jobs {job} " in ran_here(log), ran_here(log)  # asked this machine's Slurm about it


def test_an_unknown_id_goes_to_the_configured_default(laptop):
    proj, env, log, _ = laptop
    user = Path(env["XDG_CONFIG_HOME"]) / "clusterddp" / "config.toml"
    user.write_text('[defaults]\ncluster = "hpc"\n' + user.read_text())
    proc = cli("status", "99", cwd=proj, env=env)
    assert proc.returncode == 1 and "cannot log in to cluster 'hpc'" in proc.stderr, proc.stderr
    assert "is on cluster" not in proc.stderr and ran_here(log) == ""
