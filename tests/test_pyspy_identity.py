"""Issue 23, class 13: the py-spy fallback finds a rank by the environment of a process, which is its owner's to
write. Only the invoking user's processes count (another user's process that names our run directory is not our
rank, even when root runs the fallback), a DataLoader worker is not its rank, and two processes claiming one rank
are flagged, not guessed between. Real processes; another user through setpriv (as root)."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from clusterddp.runtime.pyspy import claimants, ranks_here

# A rank that starts a DataLoader-like child and says its pid (so the test ends it by pid, and knows it started).
CHILD = "import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); " \
        "print(p.pid, flush=True); time.sleep(60)"


def start(run_dir, rank, *prefix, code="import time; time.sleep(60)", stdout=None):
    env = {"PATH": os.environ["PATH"], "RANK": str(rank), "CLUSTERDDP_RUN_DIR": str(run_dir)}
    return subprocess.Popen([*prefix, sys.executable, "-c", code], env=env, cwd="/", stdout=stdout, text=True)


def wait_for(predicate, timeout=20):
    """Until ``predicate()`` holds (an event, not a fixed sleep); False after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def runs_python_as(pid, uid):
    """Process ``pid`` is this Python, owned by ``uid`` (setpriv has switched and exec'd)."""
    try:
        return os.stat(f"/proc/{pid}").st_uid == uid and os.path.realpath(f"/proc/{pid}/exe") == \
            os.path.realpath(sys.executable)
    except OSError:
        return False


def end(pid):
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


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
    rank0 = start(tmp_path, 0, code=CHILD, stdout=subprocess.PIPE)  # the rank and its DataLoader-like child
    worker = int(rank0.stdout.readline())  # started, with the same environment
    try:
        assert wait_for(lambda: runs_python_as(worker, os.geteuid()))
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
        end(worker)


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv (another user)")
def test_another_users_process_is_never_our_rank(tmp_path, monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.delenv("SLURMD_NODENAME", raising=False)
    os.chmod(tmp_path, 0o755)
    ours = start(tmp_path, 0)
    theirs = start(tmp_path, 1, "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups")
    try:
        assert wait_for(lambda: runs_python_as(theirs.pid, 65534) and runs_python_as(ours.pid, os.geteuid())), \
            "the other user's process did not start"
        assert ranks_here(str(tmp_path)) == [(0, ours.pid)]
    finally:
        ours.kill()
        theirs.kill()
