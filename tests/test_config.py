"""Profiles and precedence: command line > CLUSTERDDP_* > project file > user file > built-in defaults."""
from __future__ import annotations

import pytest
from click.testing import CliRunner

from clusterddp.cli import cli
from clusterddp.job.config import resolve

USER = """
[defaults]
partition = "user-part"
account = "user-acct"
env = { A = "user", B = "user" }
setup = ["echo user"]

[profiles.big]
nodes = 8
"""
PROJECT = """
[defaults]
partition = "proj-part"
env = { B = "project" }
setup = ["echo project"]

[profiles.big]
gpus_per_node = 4
time = "2:00:00"
"""


@pytest.fixture
def home(tmp_path, monkeypatch):
    (tmp_path / "xdg" / "clusterddp").mkdir(parents=True)
    (tmp_path / "xdg" / "clusterddp" / "config.toml").write_text(USER)
    project = tmp_path / "proj" / "sub"
    project.mkdir(parents=True)
    (tmp_path / "proj" / "clusterddp.toml").write_text(PROJECT)
    (project / "train.py").write_text("")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.chdir(project)  # the project file is found from a subdirectory too
    for name in ("CLUSTERDDP_PARTITION", "CLUSTERDDP_PROFILE", "CLUSTERDDP_QOS", "CLUSTERDDP_RUN_DIR"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def render(*args):
    r = CliRunner().invoke(cli, ["render", *args, "train.py"])
    assert r.exit_code == 0, r.output
    return r.stdout


def test_precedence(home, monkeypatch):
    out = render("-P", "big")
    assert "--partition=proj-part" in out and "--account=user-acct" in out           # project > user
    assert "--nodes=8" in out and "--gpus-per-node=4" in out and "--time=2:00:00" in out  # profiles from both files
    assert "export A=user\nexport B=project\n" in out and "echo user\necho project\n" in out  # merged / appended
    monkeypatch.setenv("CLUSTERDDP_PARTITION", "env-part")
    assert "--partition=env-part" in render("-P", "big")                                  # environment > files
    assert "--partition=cli-part" in render("-P", "big", "-p", "cli-part")               # command line > all
    assert "--nodes=2" in render("-P", "big", "--nodes", "2")
    monkeypatch.setenv("CLUSTERDDP_PROFILE", "big")
    assert "--gpus-per-node=4" in render()


def test_sources_in_config_show(home):
    r = CliRunner().invoke(cli, ["config", "show", "--profile", "big"])
    assert r.exit_code == 0, r.output
    lines = {line.split("=")[0].strip(): line for line in r.stdout.splitlines() if not line.startswith("#")}
    assert "proj/clusterddp.toml [defaults]" in lines["partition"]
    assert "xdg/clusterddp/config.toml [profiles.big]" in lines["nodes"]
    assert "built-in default" in lines["qos"]
    merged = resolve("big")
    assert merged["env"][0] == {"A": "user", "B": "project"}


def test_typos_list_the_valid_names(home, tmp_path):
    r = CliRunner().invoke(cli, ["render", "-P", "bgi", "train.py"])
    assert r.exit_code == 2 and "unknown profile 'bgi' (did you mean 'big'?); profiles defined: big" in r.stderr
    (tmp_path / "proj" / "clusterddp.toml").write_text('[defaults]\ngpus_per_nod = 4\n')
    r = CliRunner().invoke(cli, ["render", "train.py"])
    assert r.exit_code == 2 and "unknown key 'gpus_per_nod' (did you mean 'gpus_per_node'?)" in r.stderr
    (tmp_path / "proj" / "clusterddp.toml").write_text('[defaults]\nnodes = "four"\n')
    r = CliRunner().invoke(cli, ["render", "train.py"])
    assert r.exit_code == 2 and "nodes must be an integer, got 'four'" in r.stderr
    (tmp_path / "proj" / "clusterddp.toml").write_text('[default]\nnodes = 4\n')
    r = CliRunner().invoke(cli, ["render", "train.py"])
    assert r.exit_code == 2 and "unknown table 'default'" in r.stderr


def test_pyproject_tool_table(home, tmp_path):
    (tmp_path / "proj" / "clusterddp.toml").unlink()
    (tmp_path / "proj" / "pyproject.toml").write_text('[tool.clusterddp.defaults]\nqos = "high"\n')
    assert "--qos=high" in render()


def test_inside_a_job_runtime_variables_are_not_defaults(home, monkeypatch):
    # clusterddp's own job scripts export these; a job that submits another must not inherit them as options
    monkeypatch.setenv("CLUSTERDDP_RUN_DIR", "/x")
    monkeypatch.setenv("CLUSTERDDP_GPUS_PER_NODE", "8")
    monkeypatch.setenv("CLUSTERDDP_LAUNCHER", "spawn")
    out = render()
    assert "--gpus-per-node" not in out and "torchrun" in out
