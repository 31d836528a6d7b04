"""Issue 17 without a cluster: [clusters.NAME] tables (values are data), choosing a cluster, the one place remote
command lines are built (a property test through a real sh), the job's PYTHONPATH line through a real bash, the
private directory of the shared connections. The SSH round trips themselves: tests/test_remote.py."""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clusterddp.backends.ssh import connection as remote
from clusterddp.backends.ssh import copy as code_copy
from clusterddp.cli import cli
from clusterddp.errors import ClusterUnreachable, PreflightError, SpecError
from clusterddp.job.clusters import Cluster, choose, from_table
from clusterddp.job.spec import JobSpec


@pytest.mark.parametrize("table, message", [
    ({"host": "-oProxyCommand=touch /tmp/pwned"}, "host must be a host name"),
    ({"host": "login -oProxyCommand=x"}, "host must be a host name"),
    ({"host": "login", "user": "-oProxyCommand=x"}, "user must be a user name"),
    ({"host": "login", "user": "alice@evil"}, "user must be a user name"),
    ({"host": "login", "port": 0}, "port must be an integer 1-65535"),
    ({"host": "login", "port": "22"}, "port must be an integer 1-65535"),
    ({"host": "login", "remote_dir": "-rf"}, "remote_dir '-rf' cannot be used"),
    ({"host": "login", "setup": "module load slurm", "hots": 1}, "unknown key 'hots' (did you mean 'host'?)"),
    ({"user": "alice"}, "clusters.c has no host"),
    ({"host": "login\n-oProxyCommand=x"}, "host must be a host name"),
    ({"host": "login", "shell": "bash -l; rm -rf ~"}, "shell must be a shell and its options"),
    ({"host": "login", "shell": "-x"}, "shell must be a shell"),
    ({"host": "login", "shell": "bash $(id)"}, "shell must be a shell"),
    ({"host": "login", "shell": ["bash", "-l"]}, "shell must be a shell"),
    ({"host": "login", "max_copy": "1.5G"}, "max_copy must be a size such as \"500M\""),
    ({"host": "login", "max_copy": -1}, "max_copy must be a size"),
    ({"host": "login", "max_copy": "2P"}, "max_copy must be a size"),
])
def test_cluster_tables_are_data(table, message):
    with pytest.raises(SpecError, match=f"^cfg: .*{re.escape(message)}"):
        from_table("c", table, "cfg")


def test_cluster_table_values():
    c = from_table("hpc", {"host": "login.example.org", "user": "alice", "port": 2222, "remote_dir": "~/runs",
                           "setup": "module load slurm", "ssh_config": "~/.ssh/cfg"}, "cfg")
    assert c.destination == "alice@login.example.org" and c.port == 2222 and c.remote_dir == "runs"
    assert c.setup == ("module load slurm",) and c.ssh_config == os.path.expanduser("~/.ssh/cfg")
    assert c.max_copy == 1 << 30 and c.shell == ()  # the defaults
    assert from_table("c", {"host": "h", "shell": "/bin/bash --login"}, "cfg").shell == ("/bin/bash", "--login")
    sizes = {v: from_table("c", {"host": "h", "max_copy": v}, "cfg").max_copy for v in ("500M", "2GiB", "3k", 0, "0")}
    assert sizes == {"500M": 500 << 20, "2GiB": 2 << 30, "3k": 3 << 10, 0: 0, "0": 0}
    with pytest.raises(SpecError, match="reserved for this machine's own Slurm"):
        from_table("here", {"host": "x"}, "cfg")


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.delenv("CLUSTERDDP_CLUSTER", raising=False)
    monkeypatch.delenv("CLUSTERDDP_PROFILE", raising=False)
    proj = tmp_path / "proj"
    proj.mkdir()
    monkeypatch.setenv("CLUSTERDDP_TRUST", str(proj / "clusterddp.toml"))  # its clusters apply (issue 23)
    (proj / ".git").mkdir()
    (proj / "train.py").write_text("print('hi')\n")
    (proj / "clusterddp.toml").write_text('[defaults]\ncluster = "a"\n[profiles.b]\ncluster = "b"\n'
                                          '[clusters.a]\nhost = "login-a"\n[clusters.b]\nhost = "login-b"\n'
                                          'remote_dir = "/scratch/my runs"\n')
    monkeypatch.chdir(proj)
    return proj


def test_choosing_a_cluster(project, monkeypatch):
    assert choose(None).host == "login-a"                      # cluster = in [defaults]
    assert choose(None, profile="b").host == "login-b"         # the profile's
    monkeypatch.setenv("CLUSTERDDP_CLUSTER", "b")
    assert choose(None).host == "login-b"                      # the environment over the files
    assert choose("here") == Cluster() and not choose("here").remote
    assert choose("a").name == "a"                             # the option over everything
    with pytest.raises(SpecError, match=r"unknown cluster 'c'; clusters defined: a, b \(add \[clusters.c\]"):
        choose("c")


def test_dry_run_for_a_remote_cluster(project):
    """The script as it will run there: clusterddp's copied modules first on PYTHONPATH; valid bash; no
    connection needed; --local and a remote cluster do not mix."""
    r = CliRunner().invoke(cli, ["submit", "--cluster", "b", "--dry-run", "--gpus", "0", "train.py"])
    assert r.exit_code == 0, r.output
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("export PYTHONPATH="))
    assert f"'/scratch/my runs/.lib/{remote.lib_hash()}'" in line
    assert "(for cluster b)" in r.stderr
    subprocess.run(["bash", "-n"], input=r.stdout, text=True, check=True)
    here = CliRunner().invoke(cli, ["submit", "--cluster", "here", "--dry-run", "--gpus", "0", "train.py"])
    assert here.exit_code == 0 and "PYTHONPATH" not in here.stdout
    both = CliRunner().invoke(cli, ["submit", "--cluster", "a", "--local", "train.py"])
    assert both.exit_code == 2 and "choose one" in both.stderr


def test_config_show_lists_the_clusters(project):
    r = CliRunner().invoke(cli, ["config", "show"])
    assert r.exit_code == 0, r.output
    toml = project / "clusterddp.toml"
    line_a = "# cluster a: ssh login-a; code copied to clusterddp/<project>; 0 setup line(s); max_copy 1.0 GiB"
    assert f"{line_a}  # {toml}" in r.stdout
    assert "# cluster b: ssh login-b; code copied to /scratch/my runs/<project>" in r.stdout


def test_a_large_code_directory_is_refused_before_connecting(project):
    """A dataset left out of .gitignore would be copied on every submit: refused, naming the largest files,
    before any connection (the host here refuses connections). What .gitignore leaves out is not counted, and
    max_copy = 0 lifts the limit: then the next step, connecting, is what fails."""
    (project / "clusterddp.toml").write_text('[clusters.near]\nhost = "127.0.0.1"\nport = 1\nmax_copy = "100M"\n'
                                             '[clusters.unlimited]\nhost = "127.0.0.1"\nport = 1\nmax_copy = 0\n')
    (project / "data").mkdir()
    with open(project / "data" / "train.bin", "wb") as f:
        f.truncate(150 << 20)  # sparse: no disk used
    (project / "clusterddp-runs").mkdir()
    with open(project / "clusterddp-runs" / "old.ckpt", "wb") as f:
        f.truncate(500 << 20)  # the local runs' outputs are never copied
    submit = ["submit", "--gpus", "0", "--time", "5", "train.py"]
    r = CliRunner().invoke(cli, [*submit[:1], "--cluster", "near", *submit[1:]])
    assert r.exit_code == 2, r.output
    assert ("holds 150.0 MiB in 3 file(s), more than max_copy = 100.0 MiB of [clusters.near]; largest: "
            "'data/train.bin' (150.0 MiB), 'clusterddp.toml'") in r.stderr
    assert "Add data and checkpoints to .gitignore" in r.stderr and "ssh" not in r.stderr
    (project / ".gitignore").write_text("/data/\n")
    for name in ("near", "unlimited"):
        r = CliRunner().invoke(cli, [*submit[:1], "--cluster", name, *submit[1:]])
        assert r.exit_code == 1 and "max_copy" not in r.stderr, r.output
        assert f"cannot log in to cluster {name!r} (ssh 127.0.0.1): the host does not answer" in r.stderr
        assert "check that `ssh -p 1 127.0.0.1` works" in r.stderr  # what to type by hand, port included


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.org", *args],
                   check=True, capture_output=True)


def test_in_a_git_work_tree_git_chooses_what_is_copied(tmp_path, monkeypatch):
    """Every rule git applies: a .gitignore above the directory submitted from, .git/info/exclude, the global
    excludes file; a tracked file deleted here is not asked for; caches and the output directory never go.
    Checked with the real rsync, copying locally with the same arguments."""
    repo = tmp_path / "repo"
    proj = repo / "proj"
    for f in ("train.py", "lib/util.py", "data/x.bin", "run.log", "secret.txt", ".venv/lib.py", "gone.py",
              "lib/__pycache__/util.pyc", "clusterddp-runs/out.txt", "notes/.gitignore", "notes/a.md", "notes/b.tmp"):
        (proj / f).parent.mkdir(parents=True, exist_ok=True)
        (proj / f).write_text(f)
    _git(repo, "init", "-q")
    (repo / ".gitignore").write_text("data/\n*.log\n")
    (proj / "notes" / ".gitignore").write_text("*.tmp\n")
    (repo / ".git" / "info" / "exclude").write_text("secret.txt\n")
    (tmp_path / "global-ignore").write_text(".venv/\n")
    (tmp_path / "gitconfig").write_text(f"[core]\n\texcludesFile = {tmp_path / 'global-ignore'}\n")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(tmp_path / "gitconfig"))
    _git(repo, "add", "proj/gone.py", "proj/train.py")
    _git(repo, "commit", "-q", "-m", "x")
    (proj / "gone.py").unlink()
    dest = tmp_path / "dest"
    with code_copy.code_selection(JobSpec(script="train.py"), proj) as chosen:
        subprocess.run(["rsync", "-rlpt", *chosen, "--", f"{proj}/", f"{dest}/"], check=True)
    copied = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file())
    assert copied == ["lib/util.py", "notes/.gitignore", "notes/a.md", "train.py"]
    cluster = Cluster("near", "127.0.0.1", port=1)
    code_copy.check_copy(cluster, JobSpec(script="train.py"), proj)  # among what is copied: no error
    (proj / "secret.txt").rename(proj / "secret.py")
    (repo / ".git" / "info" / "exclude").write_text("secret.*\n")
    with pytest.raises(PreflightError, match=r"^training script 'secret.py' would not be copied to cluster 'near': "
                                             r"it is ignored \(.gitignore"):
        code_copy.check_copy(cluster, JobSpec(script="secret.py"), proj)


def test_an_ignored_script_is_named_before_connecting(project):
    (project / "clusterddp.toml").write_text('[clusters.near]\nhost = "127.0.0.1"\nport = 1\n')
    (project / "scratch_train.py").write_text("print(1)\n")
    (project / ".gitignore").write_text("scratch_*\n")
    r = CliRunner().invoke(cli, ["submit", "--cluster", "near", "--gpus", "0", "scratch_train.py"])
    assert r.exit_code == 2 and "training script 'scratch_train.py' would not be copied" in r.stderr, r.output


@pytest.mark.parametrize("remote_dir, expected", [("clusterddp", "{home}/clusterddp/.lib/{h}"),
                                                  ("/scratch/a b", "/scratch/a b/.lib/{h}")])
def test_the_job_finds_the_copied_modules_first(remote_dir, expected, tmp_path):
    spec = remote.job_spec(JobSpec("t.py", setup=("echo user",)), Cluster("c", "h", remote_dir=remote_dir))
    assert spec.setup[1:] == ("echo user",)
    assert remote.job_spec(spec, Cluster("c", "h", remote_dir=remote_dir)) == spec  # applied once
    out = subprocess.run(["bash", "-c", spec.setup[0] + '\nprintf %s "$PYTHONPATH"'], capture_output=True, text=True,
                         env={"HOME": str(tmp_path), "PYTHONPATH": "/mine", "PATH": os.environ["PATH"]}).stdout
    assert out == expected.format(home=tmp_path, h=remote.lib_hash()) + ":/mine"


words = st.lists(st.text(st.characters(blacklist_characters="\0", blacklist_categories=("Cs",)), max_size=20),
                 max_size=6)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(argv=words, cwd=st.text(st.characters(blacklist_characters="\0/", blacklist_categories=("Cs",)),
                               min_size=1, max_size=12))
def test_remote_command_lines_keep_every_word(tmp_path, argv, cwd):
    """What ssh hands the login shell: setup lines verbatim, then cd and the command, each word exactly as given."""
    d = tmp_path / "w"
    d.mkdir(exist_ok=True)
    try:
        (d / cwd).mkdir(exist_ok=True)
    except OSError:
        return  # a name this file system refuses ('..', too long)
    line = remote.remote_line(Cluster("c", "h", setup=("X=from-setup",)), ["printf", r"%s\0", *argv, "$X"],
                              cwd=str(d / cwd), exports={"Y": shlex.quote("y")})
    out = subprocess.run(["sh", "-c", line], capture_output=True)
    assert out.returncode == 0, line
    assert out.stdout.split(b"\0")[:-1] == [w.encode("utf-8", "surrogateescape") for w in argv] + [b"$X"]


LOGIN_SHELLS = ["sh", "bash", "tcsh", "fish"]


def _login_shell(name: str) -> str:
    path = shutil.which(name)
    if path is None:  # make install-test installs them (as root)
        pytest.skip(f"{name} is not installed")
    return path


@pytest.mark.parametrize("login_shell", LOGIN_SHELLS)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(argv=words)
def test_with_shell_set_every_login_shell_passes_the_lines_on(tmp_path, login_shell, argv):
    """sshd runs the command as `LOGIN_SHELL -c LINE`: with shell = "bash" set, csh and fish hand the sh lines on
    unchanged (the setup line and the export run in bash, each word of the command arrives as given)."""
    cluster = Cluster("c", "h", setup=("X=from-setup; export X",), shell=("bash",))
    line = remote.remote_line(cluster, ["printf", r"%s\0", *argv, "$X"], cwd=str(tmp_path),
                              exports={"Y": '"$X"-y'})
    out = subprocess.run([_login_shell(login_shell), "-c", line], capture_output=True,
                         env={"PATH": os.environ["PATH"], "HOME": str(tmp_path)})
    assert out.returncode == 0 and out.stderr == b"", (line, out.stderr)
    assert out.stdout.split(b"\0")[:-1] == [w.encode("utf-8", "surrogateescape") for w in argv] + [b"$X"]
    env = remote.remote_line(cluster, ["sh", "-c", 'printf "%s %s %s" "$X" "$Y" "$PWD"'], cwd=str(tmp_path),
                             exports={"Y": '"$X"-y'})
    out = subprocess.run([_login_shell(login_shell), "-c", env], capture_output=True, text=True,
                         env={"PATH": os.environ["PATH"], "HOME": str(tmp_path)})
    assert out.stdout == f"from-setup from-setup-y {tmp_path}", out


@pytest.mark.parametrize("login_shell", ["tcsh", "fish"])
def test_a_login_shell_that_is_not_sh_is_named(login_shell, tmp_path):
    """Without shell set, what tcsh and fish say about the sh lines becomes one line that says what to add."""
    cluster = Cluster("hpc", "login", setup=("export SLURM_CONF=/etc/slurm/slurm.conf",))
    line = remote.remote_line(cluster, ["true"], exports={"PYTHONPATH": '/lib"${PYTHONPATH:+:$PYTHONPATH}"'})
    out = subprocess.run([_login_shell(login_shell), "-c", line], capture_output=True, text=True,
                         env={"PATH": os.environ["PATH"], "HOME": str(tmp_path)})
    error = remote.not_sh(cluster, out.stderr)
    assert error is not None, out.stderr
    assert str(error).startswith("the login shell of cluster 'hpc' (ssh login) is not sh-like (it said ")
    assert 'add shell = "bash -l" to [clusters.hpc]' in str(error) and "\n" not in str(error)
    assert remote.not_sh(Cluster("hpc", "login", shell=("bash", "-l")), out.stderr) is None  # set: not checked


def test_what_sh_says_is_not_taken_for_another_shell(tmp_path):
    out = subprocess.run(["sh", "-c", "export A=1\nnosuchcommand-x\nfalse"], capture_output=True, text=True)
    assert "not found" in out.stderr and remote.not_sh(Cluster("hpc", "login"), out.stderr) is None


def test_ssh_goes_to_the_host_after_the_options():
    argv = remote.ssh_argv(Cluster("c", "login", user="alice", port=2222, ssh_config="/x/cfg"))
    assert argv[:7] == ["ssh", "-F", "/x/cfg", "-p", "2222", "-l", "alice"]
    assert any(a.startswith("ControlPath=") for a in argv) and "ControlMaster=auto" in argv
    other_key = remote.ssh_argv(Cluster("d", "login", user="alice", port=2222, ssh_config="/y/cfg"))
    path = next(a for a in argv if a.startswith("ControlPath="))
    assert path != next(a for a in other_key if a.startswith("ControlPath="))  # never another config's connection


def test_shared_connections_live_in_a_private_directory(monkeypatch):
    short = Path(f"/tmp/cddp-rt-{os.getpid()}")
    short.mkdir(mode=0o700)
    try:
        monkeypatch.setenv("XDG_RUNTIME_DIR", str(short))
        d = remote.control_dir()
        assert d == short / "clusterddp-ssh" and (d.stat().st_mode & 0o777) == 0o700
        d.chmod(0o777)  # as if someone else had made it, or loosened it
        with pytest.raises(ClusterUnreachable, match="is not a private directory of yours"):
            remote.control_dir()
    finally:
        subprocess.run(["rm", "-rf", str(short)])


@pytest.mark.parametrize("said, what", [
    ("ssh: Could not resolve hostname nope: Name or service not known", "the host name does not resolve"),
    ("ssh: connect to host 10.0.0.1 port 22: No route to host", "the host does not answer"),
    ("root@10.200.0.10: Permission denied (publickey).", "the key was refused"),
    ("Host key verification failed.", "the host key is unknown or changed"),
])
def test_what_ssh_said_becomes_one_line(said, what):
    error = remote.ssh_failure(Cluster("hpc", "login"), "Warning: something first\n" + said + "\n")
    assert error is not None and str(error).startswith(f"cannot log in to cluster 'hpc' (ssh login): {what} ")
    assert "\n" not in str(error)
    assert remote.ssh_failure(Cluster("hpc", "login"), "the command's own message\n") is None
