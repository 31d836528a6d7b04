"""Issue 24: a backend is one module behind a protocol. The test-only backend (tests/fake_backend.py) plugs in
with one registry line and runs submit, status, logs and cancel through the real CLI; a cluster naming a backend
that is not registered is refused, listing the registered ones."""
from __future__ import annotations

import json

import pytest

from clusterddp import backends
from clusterddp.cli import cli

from .conftest import cli_runner


@pytest.fixture
def fake(tmp_path, monkeypatch):
    monkeypatch.setitem(backends.REGISTRY, "fake", "tests.fake_backend:FakeBackend")  # the one registry line
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("CLUSTERDDP_FAKE_BACKEND_DIR", str(tmp_path / "fake-jobs"))
    for name in ("CLUSTERDDP_CLUSTER", "CLUSTERDDP_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "config" / "clusterddp").mkdir(parents=True)
    (tmp_path / "config" / "clusterddp" / "config.toml").write_text('[clusters.fk]\nbackend = "fake"\n')
    (tmp_path / "train.py").write_text("import sys\nprint('trained with', sys.argv[1:])\n")
    return cli_runner()


def test_the_test_backend_runs_through_the_cli(fake):
    submitted = fake.invoke(cli, ["submit", "--cluster", "fk", "--gpus", "0", "train.py", "--", "--epochs", "3"])
    assert submitted.exit_code == 0, submitted.stderr
    job = submitted.stdout.strip().splitlines()[-1]
    assert "fake backend: job 100 queued" in submitted.stderr and job == "100"
    status = fake.invoke(cli, ["status", job])  # the record finds the cluster, the cluster its backend
    assert status.exit_code == 0, status.stderr
    row = status.stdout.splitlines()[1].split()
    assert row[:3] == ["fk", job, "COMPLETED"] and "fakenode" in row, status.stdout
    logs = fake.invoke(cli, ["logs", job])
    assert logs.exit_code == 0 and logs.stdout == "trained with ['--epochs', '3']\n", (logs.stdout, logs.stderr)
    second = fake.invoke(cli, ["submit", "--cluster", "fk", "--gpus", "0", "train.py"]).stdout.split()[-1]
    cancelled = fake.invoke(cli, ["cancel", second])
    assert cancelled.exit_code == 0 and f"cancel requested for job {second}" in cancelled.stderr, cancelled.stderr
    listing = fake.invoke(cli, ["status"])
    rows = [line.split() for line in listing.stdout.splitlines()]
    assert ["fk", second, "CANCELLED"] in [r[:3] for r in rows] and ["fk", job, "COMPLETED"] in [r[:3] for r in rows]
    waited = fake.invoke(cli, ["submit", "--cluster", "fk", "--gpus", "0", "train.py", "--wait"])
    assert waited.exit_code == 0 and "ended COMPLETED, exit code 0" in waited.stderr, waited.stderr
    shown = fake.invoke(cli, ["config", "show"])
    assert "# cluster fk: backend fake  # " in shown.stdout, shown.stdout


def test_dry_run_sweep_stacks_and_drill_go_through_the_backend(fake, tmp_path):
    """Issue 38: --dry-run prints what the backend's submit writes; what it cannot do (a sweep's array, stacks,
    the drill's emulated nodes) is one line naming the backend, exit 2, nothing submitted."""
    dry = fake.invoke(cli, ["submit", "--dry-run", "--cluster", "fk", "--gpus", "0", "train.py", "--", "--lr", "1"])
    assert dry.exit_code == 0, dry.stderr
    assert json.loads(dry.stdout) == {"state": "PENDING", "argv": ["train.py", "--lr", "1"], "cwd": str(tmp_path)}
    assert "dry run, nothing submitted" in dry.stderr and not (tmp_path / "fake-jobs").exists()
    job = fake.invoke(cli, ["submit", "--cluster", "fk", "--gpus", "0", "train.py"]).stdout.split()[-1]
    written = json.loads((tmp_path / "fake-jobs" / f"{job}.json").read_text())
    assert {k: written[k] for k in ("argv", "cwd")} == {"argv": ["train.py"], "cwd": str(tmp_path)}
    for argv, what in ((["sweep", "--cluster", "fk", "--gpus", "0", "--grid", "lr=1,2", "train.py", "--", "{lr}"],
                        "a sweep (one job array) is not supported by the fake backend (cluster fk)"),
                       (["stacks", "--cluster", "fk", job], "asking a job's ranks for their stacks (clusterddp "
                                                             "stacks) is not supported by the fake backend"),
                       (["drill", "--cluster", "fk", "--gpus", "0", "train.py"],
                        "the drill (it runs on this machine, the local backend: drop --cluster) is not supported "
                        "by the fake backend (cluster fk)")):
        r = fake.invoke(cli, argv)
        assert r.exit_code == 2 and what in r.stderr and "Traceback" not in r.stderr, (argv, r.stderr)
    assert sorted(p.name for p in (tmp_path / "fake-jobs").glob("*.json")) == [f"{job}.json"]  # nothing else ran


def test_an_unregistered_backend_is_refused_with_the_names(fake, tmp_path):
    (tmp_path / "config" / "clusterddp" / "config.toml").write_text('[clusters.fk]\nbackend = "slrum"\n')
    r = fake.invoke(cli, ["submit", "--cluster", "fk", "train.py"])
    assert r.exit_code == 2 and "unknown backend 'slrum'" in r.stderr and "did you mean 'slurm'" in r.stderr, r.stderr
    assert "fake, slurm" in r.stderr and "Traceback" not in r.stderr


def test_a_slurm_cluster_still_needs_a_host(fake, tmp_path):
    (tmp_path / "config" / "clusterddp" / "config.toml").write_text('[clusters.fk]\nremote_dir = "x"\n')
    r = fake.invoke(cli, ["submit", "--cluster", "fk", "train.py"])
    assert r.exit_code == 2 and "clusters.fk has no host" in r.stderr, r.stderr
