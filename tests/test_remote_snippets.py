"""Issue 52: every sh snippet clusterddp sends to a login node, run here exactly as the login shell there runs it
(remote_line: setup lines, then `sh -c SNIPPET clusterddp ARGS...`, started in the home as sshd starts it),
against each form of remote_dir the docs allow: the default (relative to the home), "~/x", "~", a nested relative
one, an absolute one, and a home reached through a symbolic link. Each answer has a bound of a few seconds, so a
snippet that loops fails here at once instead of waiting for the 60-s answer limit. No SSH and no root needed: the
real SSH path with these profiles is tests/test_remote.py's."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from clusterddp.backends.ssh import connection
from clusterddp.backends.ssh import copy as code_copy
from clusterddp.errors import ClusterUnreachable, SpecError
from clusterddp.job.clusters import from_table
from clusterddp.job.spec import JobSpec

LIMIT_S = 10  # a snippet answers in well under a second; more is a loop


@pytest.fixture
def login(tmp_path, monkeypatch):
    """connection.run replaced by the same line run here: `sh -c LINE` in the login's home (HOME set as sshd sets
    it), with the answer bounded. Yields a function that makes the home (optionally reached through a link)."""
    bin_dir = tmp_path / "login-bin"
    bin_dir.mkdir()
    if not shutil.which("rsync"):  # the login's command check only (make install-test installs rsync as root)
        (bin_dir / "rsync").write_text("#!/bin/sh\nexit 0\n")
        (bin_dir / "rsync").chmod(0o755)
    state = {}

    def run(cluster, argv, cwd=None, timeout=60, input=None, exports=None):
        line = connection.remote_line(cluster, argv, cwd, exports)
        env = {"HOME": state["home"],
               "PATH": os.pathsep.join([str(bin_dir), os.path.dirname(sys.executable), os.environ["PATH"]])}
        try:
            return subprocess.run(["sh", "-c", line], cwd=state["home"], env=env, input=input, capture_output=True,
                                  text=True, timeout=LIMIT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"a remote snippet did not end within {LIMIT_S} s: {argv[:3]}")

    monkeypatch.setattr(connection, "run", run)

    def make_home(linked: bool = False) -> Path:
        real = tmp_path / "real-home"
        real.mkdir(mode=0o700)
        home = real
        if linked:  # /home/alice -> /gpfs/home/alice, as many sites have it
            home = tmp_path / "home-link"
            home.symlink_to(real)
        state["home"] = str(home)
        return real

    return make_home


FORMS = [  # remote_dir as written in [clusters.NAME] (None: not set), and where it puts the project's copy
    (None, "clusterddp"),
    ("clusterddp", "clusterddp"),
    ("~/x", "x"),
    ("~", "."),
    ("work/deep/cddp", "work/deep/cddp"),
    ("ABSOLUTE", None),
]


@pytest.mark.parametrize("linked", [False, True], ids=["home", "linked-home"])
@pytest.mark.parametrize("written, under_home", FORMS, ids=[str(f[0]) for f in FORMS])
def test_each_snippet_ends_and_agrees_for_every_remote_dir_form(login, tmp_path, written, under_home, linked):
    real_home = login(linked)
    table = {"host": "login.example"}
    if written == "ABSOLUTE":
        written = str(tmp_path / "scratch" / "me" / "cddp")
    if written is not None:
        table["remote_dir"] = written
    cluster = from_table("hpc", table, "test")
    base = Path(written) if under_home is None else (real_home / under_home)
    proj = tmp_path / "laptop" / "proj"
    proj.mkdir(parents=True)
    (proj / "train.py").write_text("print('hi')\n")
    spec = JobSpec("train.py")

    expected = os.path.normpath(base.resolve() / "proj") if base.exists() else os.path.normpath(base / "proj")
    before = code_copy.code_dir(cluster, proj)  # --dry-run's question: nothing made yet
    assert before == expected, (before, expected)
    assert not (base / "proj").exists()

    path = code_copy.make_code_dir(cluster, spec, proj, check=True)  # python3 and torchrun found on PATH
    assert path == os.path.normpath(base.resolve() / "proj")
    assert Path(path).is_dir() and (Path(path) / ".clusterddp-origin").read_text().startswith(os.uname().nodename)
    lib = base / ".lib" / connection.lib_hash() / "clusterddp"
    assert lib.is_dir() and not (Path(path) / ".lib").exists()  # beside the copy, not inside it
    assert oct(Path(path).stat().st_mode & 0o777) == "0o700"  # new directories private
    assert code_copy.code_dir(cluster, proj) == path  # the dry run and the submission agree
    assert code_copy.make_code_dir(cluster, spec, proj) == path  # again: the copy is reused

    # A setup line that changes directory does not move a relative remote_dir (sh starts in the home).
    moved = from_table("hpc", {**table, "setup": ["cd /"]}, "test")
    assert code_copy.make_code_dir(moved, spec, proj) == path and code_copy.code_dir(moved, proj) == path

    connection.sh(cluster, 'mkdir -p -- "$1"', [connection.lib_dir(cluster) + "/clusterddp"])  # ensure_lib's line
    assert lib.is_dir()
    connection.write(cluster, f"{path}/clusterddp-runs/7/job.sh", "echo hi\n")
    assert (Path(path) / "clusterddp-runs" / "7" / "job.sh").read_text() == "echo hi\n"
    assert connection.move_aside(cluster, [f"{path}/clusterddp-runs/7/job.sh"]) == [
        [f"{path}/clusterddp-runs/7/job.sh", f"{path}/clusterddp-runs/7/job.sh.1"]]
    if shutil.which("rsync") or os.environ.get("CI", "").lower() == "true":  # (CI installs rsync)
        snap = code_copy.snapshot(cluster, spec, proj, path, [])
        assert snap.startswith(f"{os.path.dirname(path)}/.snapshots/proj/") and Path(snap).is_dir()


def test_an_unresolvable_code_directory_ends_and_says_what_it_found(login, tmp_path):
    """The bug of issue 52 in its general form: a path the preparation cannot resolve ends it with a line that
    names the path, within the bound (the walk up to / never loops)."""
    home = login()
    (home / "file").write_text("not a directory")
    cluster = from_table("hpc", {"host": "login.example", "remote_dir": "file/cddp"}, "test")
    proj = tmp_path / "proj"
    proj.mkdir()
    said = (r"cannot create the code directory file/cddp/proj on cluster 'hpc' \(ssh login.example\): .*file.*; "
            r"check remote_dir in \[clusters.hpc\]")
    with pytest.raises(ClusterUnreachable, match=said):
        code_copy.make_code_dir(cluster, JobSpec("train.py"), proj)


def test_tilde_forms_are_read_as_the_docs_say():
    assert from_table("c", {"host": "h"}, "t").remote_dir == "clusterddp"
    assert from_table("c", {"host": "h", "remote_dir": "~/a/b"}, "t").remote_dir == "a/b"
    assert from_table("c", {"host": "h", "remote_dir": "~"}, "t").remote_dir == "."
    for refused in ("~alice/x", "", "-rf", "a\\b"):
        with pytest.raises(SpecError, match=r"clusters.c.remote_dir"):
            from_table("c", {"host": "h", "remote_dir": refused}, "t")
