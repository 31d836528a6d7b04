"""User values reach the training script byte for byte and never execute.

Each rendered script runs under bash with stand-in srun/torchrun/scontrol on PATH and a fake Slurm
environment; a recorder script writes the argv and environment that arrived.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clusterddp import JobSpec
from clusterddp.backends.slurm.script import render

from .cases import CASES, HOSTILE_ARGS, STANDINS, run_rendered

HERE = Path(__file__).parent
RECORDER = HERE / "scripts" / "record_argv.py"
ROOT = HERE.parent


@pytest.mark.parametrize("launcher", ["torchrun", "srun", "spawn"])
def test_hostile_values_arrive_unchanged(launcher, tmp_path):
    (tmp_path / "my script.py").write_text(RECORDER.read_text())
    spec = CASES["hostile"].replace(launcher=launcher)
    got = run_rendered(spec, tmp_path, env_names=["WEIRD", "RANK", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT"])
    expected = list(HOSTILE_ARGS)
    if launcher == "spawn":  # the placeholder is filled in, everything else untouched
        expected[-1] = "node1"
    assert got["argv"] == expected
    assert got["env"]["WEIRD"] == dict(spec.env)["WEIRD"]
    # spawn scripts compute their own ranks; the other launchers hand them over
    assert got["env"]["RANK"] == (None if launcher == "spawn" else "0")
    assert got["env"]["NODE_RANK"] in (None, "0") and got["env"]["MASTER_ADDR"] == "node1"
    assert 20000 <= int(got["env"]["MASTER_PORT"]) < 30000
    # the per-task log went where the README says, in a directory whose name holds a '%'
    logs = list((tmp_path / "runs dir" / "100%").glob("*-4242/*.out"))
    assert logs, list(tmp_path.rglob("*"))


def test_module_entry_point(tmp_path):
    pkg = tmp_path / "recpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "rec.py").write_text(RECORDER.read_text())
    for launcher in ("torchrun", "srun"):
        got = run_rendered(JobSpec("recpkg.rec", module=True, args=("a b",), launcher=launcher), tmp_path)
        assert got["argv"] == ["a b"]


def test_master_port_falls_back_when_taken(tmp_path):
    import socket

    (tmp_path / "r.py").write_text(RECORDER.read_text())
    busy = socket.socket()
    busy.bind(("", 20000 + 4242 % 10000))
    busy.listen()
    try:
        got = run_rendered(JobSpec("r.py", launcher="srun"), tmp_path, env_names=["MASTER_PORT"])
        assert got["env"]["MASTER_PORT"] == str(20000 + 4243 % 10000)
        # An explicit port is taken as given, and a busy one is an error, not a silent change.
        script = tmp_path / "strict.sh"
        script.write_text(render(JobSpec("r.py", master_port=busy.getsockname()[1])))
        env = dict(os.environ, PATH=f"{STANDINS}:{os.environ['PATH']}", SLURM_JOB_ID="1", SLURM_JOB_NODELIST="n1",
                   RECORD_FILE=str(tmp_path / "x.json"), PYTHONPATH=str(ROOT))
        proc = subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True)
        assert proc.returncode != 0 and "already in use" in proc.stderr
    finally:
        busy.close()


def test_invalid_hostlist_fails_loudly(tmp_path):
    (tmp_path / "r.py").write_text(RECORDER.read_text())
    script = tmp_path / "job.sh"
    script.write_text(render(JobSpec("r.py")))
    fake = tmp_path / "bin"
    fake.mkdir()
    # scontrol's real behaviour for a bad list: a message on stderr, nothing on stdout, exit code 0.
    (fake / "scontrol").write_text("#!/bin/sh\necho 'scontrol: error: Invalid hostlist' >&2\nexit 0\n")
    (fake / "scontrol").chmod(0o755)
    env = dict(os.environ, PATH=f"{fake}:{STANDINS}:{os.environ['PATH']}", SLURM_JOB_ID="7",
               SLURM_JOB_NODELIST="bad[", RECORD_FILE=str(tmp_path / "x.json"))
    proc = subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == 1
    assert "refusing to guess MASTER_ADDR" in proc.stderr
    assert not (tmp_path / "x.json").exists()


text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=40)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(args=st.lists(text, max_size=6), value=text, launcher=st.sampled_from(["torchrun", "srun", "spawn"]))
def test_any_text_arrives_byte_for_byte(tmp_path, args, value, launcher):
    (tmp_path / "rec.py").write_text(RECORDER.read_text())
    if launcher == "spawn":  # placeholders are the one documented transformation
        args = [a.replace("{", "(") for a in args]
    spec = JobSpec("rec.py", args=tuple(args), env=(("VALUE", value),), launcher=launcher)
    got = run_rendered(spec, tmp_path, env_names=["VALUE"])
    assert got["argv"] == args
    assert got["env"]["VALUE"] == value
