"""Shared fixtures. The real Slurm test cluster is started once per session (tests/slurm/cluster.sh)."""
from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = Path(__file__).resolve().parent / "scripts"
CLUSTER_SH = Path(__file__).resolve().parent / "slurm" / "cluster.sh"
CLUSTER_DIR = os.environ.get("CLUSTERDDP_CLUSTER_DIR", "/tmp/clusterddp-cluster")


def cluster_impossible() -> str:
    """Why the test cluster cannot exist here ('' when it can)."""
    if platform.system() != "Linux":
        return "the Slurm test cluster needs Linux (network and UTS namespaces)"
    if os.geteuid() != 0:
        return "the Slurm test cluster needs root (network namespaces, munged, slurmd)"
    return ""


@pytest.fixture(scope="session")
def slurm_cluster():
    """A running 2-node cluster; yields the environment (SLURM_CONF) that clients need."""
    why = cluster_impossible()
    if why:
        pytest.skip(why)
    if not shutil.which("slurmctld"):
        subprocess.run([str(CLUSTER_SH), "install"], check=True)
    keep = os.environ.get("CLUSTERDDP_KEEP_CLUSTER") == "1"
    subprocess.run([str(CLUSTER_SH), "up"], check=True)
    env = dict(os.environ, SLURM_CONF=f"{CLUSTER_DIR}/slurm.conf")
    yield env
    if not keep:
        subprocess.run([str(CLUSTER_SH), "down"], check=False)


@pytest.fixture
def slurm_env(slurm_cluster, monkeypatch, tmp_path):
    """SLURM_CONF set for this test, and a private clusterddp state directory."""
    monkeypatch.setenv("SLURM_CONF", slurm_cluster["SLURM_CONF"])
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return slurm_cluster


def run_cli(*args: str, cwd: Path, env: dict | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    """The real console entry point in a subprocess (as a user types it)."""
    return subprocess.run([sys.executable, "-m", "clusterddp", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def pytest_addoption(parser):
    parser.addoption("--update-golden", action="store_true", help="rewrite tests/golden/*.sh from the current code")
