"""Issue 23, class 13: the py-spy fallback finds a rank by the environment of a process, which is its owner's to
write. Only the invoking user's processes count (another user's process that names our run directory is not our
rank, even when root runs the fallback), a DataLoader worker is not its rank, and two processes claiming one rank
are flagged, not guessed between. Real processes; another user through setpriv (as root)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest

from clusterddp.runtime.pyspy import claimants, ranks_here

CHILD = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); " \
        "time.sleep(60)"


def start(run_dir, rank, *prefix, code="import time; time.sleep(60)"):
    env = {"PATH": os.environ["PATH"], "RANK": str(rank), "CLUSTERDDP_RUN_DIR": str(run_dir)}
    return subprocess.Popen([*prefix, sys.executable, "-c", code], env=env, cwd="/")


def settle(run_dir, want, timeout=20):
    deadline = time.monotonic() + timeout
    while True:
        found = claimants(str(run_dir))
        if sum(len(p) for p in found.values()) >= want or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def test_a_rank_and_its_workers_are_one_rank(tmp_path, monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.delenv("SLURMD_NODENAME", raising=False)
    rank0 = start(tmp_path, 0, code=CHILD)  # the rank and its DataLoader-like child, same environment
    try:
        time.sleep(1.5)
        assert ranks_here(str(tmp_path)) == [(0, rank0.pid)]
        twin = start(tmp_path, 0)
        try:
            found = settle(tmp_path, 2)
            assert sorted(found[0]) == sorted([rank0.pid, twin.pid])  # flagged: two claim rank 0
            assert ranks_here(str(tmp_path)) == []
        finally:
            twin.kill()
    finally:
        rank0.kill()
        subprocess.run(["pkill", "-f", "import time; time.sleep(60)"], check=False)


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv (another user)")
def test_another_users_process_is_never_our_rank(tmp_path, monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.delenv("SLURMD_NODENAME", raising=False)
    os.chmod(tmp_path, 0o755)
    ours = start(tmp_path, 0)
    theirs = start(tmp_path, 1, "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups")
    try:
        time.sleep(1.5)
        assert theirs.poll() is None, "the other user's process did not start"
        assert ranks_here(str(tmp_path)) == [(0, ours.pid)]
    finally:
        ours.kill()
        theirs.kill()
