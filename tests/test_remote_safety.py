"""Issue 23, classes 7, 8, 12: what crosses to and from a login node. rsync always passes names as data
(--protect-args; an rsync without it is refused before connecting), remote_dir is a path both rsync and the shell
read the same way (no ~user), and what comes back from a run directory never includes links (the real rsync, run
here with the same arguments)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from clusterddp.backends.ssh.mirror import PULL_ARGS
from clusterddp.errors import SpecError
from clusterddp.job.clusters import from_table

from .conftest import ROOT


def test_an_rsync_without_protect_args_is_refused_before_connecting(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "rsync").write_text("#!/bin/sh\necho 'rsync  version 2.6.9  protocol version 29'\n")
    (bin_dir / "ssh").write_text(f"#!/bin/sh\ntouch {tmp_path}/ssh-ran\nexit 255\n")
    for name in ("rsync", "ssh"):
        (bin_dir / name).chmod(0o755)
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "train.py").write_text("print(1)\n")
    config = tmp_path / "xdg" / "clusterddp"
    config.mkdir(parents=True)
    (config / "config.toml").write_text('[clusters.near]\nhost = "127.0.0.1"\nport = 1\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "CLUSTERDDP_"))}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env['PATH']}", PYTHONPATH=str(ROOT), XDG_CONFIG_HOME=str(tmp_path / "xdg"),
               XDG_STATE_HOME=str(tmp_path / "state"))
    proc = subprocess.run([sys.executable, "-m", "clusterddp", "submit", "--cluster", "near", "--gpus", "0",
                           "train.py"], cwd=proj, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.strip() == ("clusterddp: error: this machine's rsync is version 2.6.9, older than 3.0: it "
                                   "cannot pass file names to the cluster as data (--protect-args); install a newer "
                                   "one (brew install rsync, apt install rsync)")
    assert not (tmp_path / "ssh-ran").exists()


@pytest.mark.parametrize("remote_dir", ["~alice/clusterddp", "~~", "~alice"])
def test_remote_dir_with_a_tilde_user_is_refused(remote_dir):
    with pytest.raises(SpecError, match="cannot be used"):
        from_table("c", {"host": "h", "remote_dir": remote_dir}, "cfg")
    assert from_table("c", {"host": "h", "remote_dir": "~/runs"}, "cfg").remote_dir == "runs"
    for home in ("~", "~/"):  # the home itself (issue 52), relative to it as every relative remote_dir is
        assert from_table("c", {"host": "h", "remote_dir": home}, "cfg").remote_dir == "."


def test_links_in_a_remote_run_directory_do_not_come_back(tmp_path):
    """Class 12: `logs --rank 0` printed this machine's ~/.ssh/id_ed25519 through a link planted in the remote run
    directory (rsync -l copied the link; reading the mirror followed it here). The pull skips links."""
    secret = tmp_path / "id_ed25519"
    secret.write_text("PRIVATE KEY\n")
    remote = tmp_path / "remote" / "train-7"
    remote.mkdir(parents=True)
    (remote / "rank-1.out").write_text("a log\n")
    os.symlink(secret, remote / "rank-0.out")
    (remote / "stacks").mkdir()
    os.symlink("/etc", remote / "stacks" / "ranks")
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    proc = subprocess.run(["rsync", "--protect-args", *PULL_ARGS, "--", str(remote), f"{mirror}/"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert (mirror / "train-7" / "rank-1.out").read_text() == "a log\n"
    assert not os.path.lexists(mirror / "train-7" / "rank-0.out")
    assert not os.path.lexists(mirror / "train-7" / "stacks" / "ranks")


def test_logs_never_follow_a_link(tmp_path):
    from clusterddp.backends.record import JobRecord

    env = {**os.environ, "PYTHONPATH": str(ROOT), "XDG_STATE_HOME": str(tmp_path / "state")}
    env.pop("SLURM_CONF", None)
    (tmp_path / "secret").write_text("PRIVATE\n")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    os.symlink(tmp_path / "secret", run_dir / "rank-0.out")
    old = os.environ.get("XDG_STATE_HOME")
    os.environ["XDG_STATE_HOME"] = str(tmp_path / "state")
    try:
        JobRecord("9", str(tmp_path / "s.sbatch"), str(tmp_path / "b.out"), str(run_dir), "srun", 1, 1).save()
    finally:
        if old is None:
            os.environ.pop("XDG_STATE_HOME")
        else:
            os.environ["XDG_STATE_HOME"] = old
    proc = subprocess.run([sys.executable, "-m", "clusterddp", "logs", "9", "--rank", "0"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "PRIVATE" not in proc.stdout, proc.stdout + proc.stderr
    assert "is a symbolic link: not followed" in proc.stderr and "Traceback" not in proc.stderr


def _prepare(code: Path, lib: Path, origin: str = "laptop:/home/me/proj", instead: str = "") -> list:
    from clusterddp.backends.ssh.copy import _PREPARE

    proc = subprocess.run(["sh", "-c", _PREPARE, "clusterddp", str(code), str(lib), origin,
                           instead or f"{code}-other", "sh"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


@pytest.mark.skipif(os.geteuid() != 0, reason="another user's directory needs root to make")
def test_a_parent_of_the_code_directory_owned_by_someone_else_is_named(tmp_path):
    """Class 2: `mkdir -p` took directories as found, so a /scratch/alice made first by another user let that user
    swap train.py or the modules. The login node's part of submit (this sh script, run here by sh as ssh runs it
    there) names every such directory on the way up; new directories are private."""
    os.chmod(tmp_path, 0o755)
    theirs = tmp_path / "scratch" / "alice"
    theirs.mkdir(parents=True)
    os.chown(theirs, 65534, 65534)
    lines = _prepare(theirs / "clusterddp" / "proj", theirs / "clusterddp" / ".lib" / "abc")
    assert lines[0] == str(theirs / "clusterddp" / "proj")
    assert f"unsafe {theirs}" in lines
    mine = tmp_path / "mine"
    lines = _prepare(mine / "clusterddp" / "proj", mine / "clusterddp" / ".lib" / "abc")
    assert not [ln for ln in lines if ln.startswith("unsafe")], lines
    assert oct((mine / "clusterddp" / "proj").stat().st_mode & 0o777) == "0o700"
    shared = tmp_path / "group"
    shared.mkdir(mode=0o775)
    shared.chmod(0o775)
    assert f"unsafe {shared}" in _prepare(shared / "p", shared / "l")
    sticky = tmp_path / "tmpdir"
    sticky.mkdir()
    sticky.chmod(0o1777)
    assert not [ln for ln in _prepare(sticky / "me" / "p", sticky / "me" / "l") if ln.startswith("unsafe")]


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.org",
                    "-c", "protocol.file.allow=always", *args], check=True, capture_output=True)


def _copied(proj: Path, dest: Path) -> list:
    from clusterddp.backends.ssh import copy as code_copy
    from clusterddp.job.spec import JobSpec

    with code_copy.code_selection(JobSpec(script="train.py"), proj) as chosen:
        subprocess.run(["rsync", "--protect-args", "-rlpt", *chosen, "--", f"{proj}/", f"{dest}/"], check=True)
    return sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file() or p.is_symlink())


def test_nested_repositories_and_submodules_go_by_their_own_rules(tmp_path, monkeypatch):
    """Class 5: a nested repository or a submodule went out whole, .git included (a token in its remote URL), with
    its ignored data and .env files. Now each goes by its own git rules, file by file, without its .git."""
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(tmp_path / "no-global-config"))
    sub = tmp_path / "sub-origin"
    sub.mkdir()
    (sub / "lib.py").write_text("x = 1\n")
    (sub / ".gitignore").write_text("secret.env\n")
    _git(sub, "init", "-q")
    _git(sub, "add", ".")
    _git(sub, "commit", "-q", "-m", "s")
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "train.py").write_text("print(1)\n")
    _git(proj, "init", "-q")
    _git(proj, "submodule", "add", "-q", str(sub), "vendor")
    (proj / "vendor" / "secret.env").write_text("TOKEN=1\n")
    nested = proj / "tools"
    nested.mkdir()
    (nested / "tool.py").write_text("pass\n")
    (nested / ".env").write_text("TOKEN=2\n")
    (nested / ".gitignore").write_text(".env\n")
    _git(nested, "init", "-q")
    _git(nested, "remote", "add", "origin", "https://user:ghp_token@example.org/x.git")
    copied = _copied(proj, tmp_path / "dest")
    assert copied == [".gitmodules", "tools/.gitignore", "tools/tool.py", "train.py", "vendor/.gitignore",
                      "vendor/lib.py"], copied


def test_outside_git_the_ignore_rules_are_gits(tmp_path, monkeypatch):
    """Class 6: outside a git work tree rsync read .gitignore by its own rules: 'secret.env ' (git drops the
    trailing space) and '\\#notes.txt' leaked the files, and '!config.json' dropped a file git keeps."""
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(tmp_path / "no-global-config"))
    proj = tmp_path / "proj"
    proj.mkdir()
    for name in ("train.py", "secret.env", "#notes.txt", "a.json", "config.json"):
        (proj / name).write_text(name)
    (proj / ".gitignore").write_text("secret.env \n\\#notes.txt\n*.json\n!config.json\n")
    copied = _copied(proj, tmp_path / "dest")
    assert copied == [".gitignore", "config.json", "train.py"], copied


def test_without_git_a_pattern_rsync_reads_otherwise_is_refused(tmp_path, monkeypatch):
    from clusterddp.backends.ssh import copy as code_copy
    from clusterddp.errors import PreflightError
    from clusterddp.job.spec import JobSpec

    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "train.py").write_text("print(1)\n")
    (proj / ".gitignore").write_text("*.json\n!config.json\n")
    monkeypatch.setenv("PATH", str(tmp_path / "no-git-here"))
    with pytest.raises(PreflightError, match=r"reads \.gitignore:2: '!config\.json' otherwise than git"):
        with code_copy.code_selection(JobSpec(script="train.py"), proj):
            pass


def test_status_copies_only_an_ended_jobs_reports(tmp_path):
    """Class 15: status pulled every finished remote job's whole run directory (logs included) on every call; it
    now takes only the roll call and the rendezvous report (the real rsync, here, with the same filter)."""
    from clusterddp.backends.ssh.mirror import REPORT_FILTER

    run = tmp_path / "remote" / "train-7"
    for name in ("rank-0.out", "stacks/ranks/rank-0.json", "stacks/hang-0/rollcall.txt", "stacks/hang-0/rank-0.txt",
                 "stacks/hang-0/rollcall.json", "stacks/rendezvous-0.txt", "checkpoints/ckpt-1.pt"):
        (run / name).parent.mkdir(parents=True, exist_ok=True)
        (run / name).write_text(name)
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    subprocess.run(["rsync", "--protect-args", "-rt", "--no-links", "--prune-empty-dirs", *REPORT_FILTER, "--",
                    str(run), f"{mirror}/"], check=True)
    got = sorted(str(p.relative_to(mirror)) for p in mirror.rglob("*") if p.is_file())
    assert got == ["train-7/stacks/hang-0/rollcall.json", "train-7/stacks/hang-0/rollcall.txt",
                   "train-7/stacks/rendezvous-0.txt"], got


def test_two_projects_with_one_directory_name_get_two_copies(tmp_path):
    """Class 4 (part): REMOTE_DIR/<name> held whichever project of that name was submitted last. The copy now
    records where it came from; another origin gets its own directory (REMOTE_DIR/<name>-<hash>)."""
    code, lib = tmp_path / "clusterddp" / "proj", tmp_path / "clusterddp" / ".lib"
    assert _prepare(code, lib, "laptop:/home/me/proj")[0] == str(code)
    assert _prepare(code, lib, "laptop:/home/me/proj")[0] == str(code)         # the same project: the same copy
    other = _prepare(code, lib, "laptop:/home/me/work/proj", f"{code}-1a2b3c4d")
    assert other[0] == f"{code}-1a2b3c4d"
    assert (code / ".clusterddp-origin").read_text() == "laptop:/home/me/proj\n"


def test_an_edit_of_the_same_size_in_the_same_second_is_sent(tmp_path):
    """Class 4 (part): rsync's quick check (size and time) skipped such an edit; the copy compares checksums."""
    from clusterddp.backends.ssh.copy import COPY_ARGS

    src, dest = tmp_path / "src", tmp_path / "dest"
    src.mkdir()
    (src / "train.py").write_text("lr = 0.1\n")
    subprocess.run(["rsync", *COPY_ARGS, "--", f"{src}/", f"{dest}/"], check=True)
    st = (src / "train.py").stat()
    (src / "train.py").write_text("lr = 0.9\n")
    os.utime(src / "train.py", ns=(st.st_atime_ns, st.st_mtime_ns))
    subprocess.run(["rsync", *COPY_ARGS, "--", f"{src}/", f"{dest}/"], check=True)
    assert (dest / "train.py").read_text() == "lr = 0.9\n"
