"""Issue 23, class 10: files in a run directory are data with bounds. Hostile hello, dump and roll-call files (deep
nesting, huge or wrong-typed numbers, symlinks, files too large) are ignored or bounded: `clusterddp stacks` ends
at once with its roll call, never in a traceback or an endless loop."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from clusterddp import contract, rollcall

from .conftest import ROOT


def hello(rank, **extra):
    return json.dumps({"rank": rank, "restart": 0, "state": "left", "node": "n1", "world_size": 2,
                       "local_world_size": 2, "launcher": "srun", **extra})


def plant(run_dir: Path, name: str, text: str) -> Path:
    path = run_dir / contract.HELLO_FILE.format(rank=0).replace("rank-0.json", name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.mark.parametrize("text", [
    hello(0, world_size=10 ** 12),                   # a world of 10^12 ranks: once an endless loop
    hello(0, world_size="x", local_world_size=[1]),  # ValueError / TypeError
    hello(0, world_size=True),
    "[" * 100000 + "]" * 100000,                     # RecursionError
    json.dumps({"rank": 10 ** 30, "restart": 0}),
    hello(0) + " " * (2 << 20),                      # larger than any hello
])
def test_stacks_survives_a_hostile_hello_file(tmp_path, text):
    run_dir = tmp_path / "run"
    plant(run_dir, "rank-0.json", text)
    plant(run_dir, "rank-1.json", hello(1))
    proc = subprocess.run([sys.executable, "-m", "clusterddp", "stacks", str(run_dir), "--no-py-spy", "--timeout",
                           "1"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})  # (a file that hangs it fails the test)
    assert "Traceback" not in proc.stderr and proc.returncode in (0, 1), proc.stderr
    assert "rank 1" in proc.stdout or "ranks 0-1" in proc.stdout or "1 (" in proc.stdout, proc.stdout


def test_hellos_are_read_with_bounds_and_types(tmp_path):
    plant(tmp_path, "rank-0.json", hello(0, world_size=10 ** 12, pid="x", node=["a"]))
    plant(tmp_path, "rank-1.json", hello(2))         # filed under another rank's name
    plant(tmp_path, "rank-3.json", hello(3, node="n" * 5000))
    secret = tmp_path / "secret.json"
    secret.write_text(hello(4))
    os.symlink(secret, tmp_path / "stacks" / "ranks" / "rank-4.json")  # never followed
    found = rollcall.read_hellos(tmp_path)
    assert sorted(found) == [0, 3]
    assert "world_size" not in found[0] and found[0]["pid"] is None and found[0]["node"] == "?"
    assert len(found[3]["node"]) == 1000


def test_dumps_and_roll_calls_are_read_with_bounds(tmp_path):
    d = tmp_path / "dump"
    d.mkdir()
    (d / "rank-0.json").write_text(json.dumps({"rank": 0, "threads": [{"frames": [{"line": 2 ** 70}]}] * 5000}))
    (d / "rank-1.json").write_text(json.dumps({"rank": 7, "threads": []}))  # not rank 1's
    (d / "rank-2.json").write_text(json.dumps({"rank": True, "threads": []}))
    dumps = rollcall.read_dumps(d)
    assert [x["rank"] for x in dumps] == [0]
    assert len(dumps[0]["threads"]) == 2000 and dumps[0]["threads"][0]["frames"][0]["line"] == 0
    hang = tmp_path / "stacks" / "hang-0"
    hang.mkdir(parents=True)
    (tmp_path / "elsewhere.txt").write_text("someone else's file\n")
    os.symlink(tmp_path / "elsewhere.txt", hang / "rollcall.txt")
    assert rollcall.hang_report(tmp_path) is None  # a link is not followed
    (hang / "rollcall.txt").unlink()
    (hang / "rollcall.txt").write_text("x" * (2 << 20))
    assert rollcall.hang_report(tmp_path) is None  # too large to be a roll call


def test_a_record_that_is_a_link_or_of_another_shape_is_no_record(tmp_path):
    """Class 15: a dangling record symlink was a traceback in `status`; links and records of another shape are
    now not records."""
    jobs = tmp_path / "state" / "clusterddp" / "jobs" / "here"
    jobs.mkdir(parents=True)
    os.symlink(tmp_path / "nowhere", jobs / "5.json")
    (jobs / "6.json").write_text(json.dumps({"job_id": "6", "nodes": "all"}))
    (tmp_path / "real.json").write_text(json.dumps({"job_id": "7", "script_path": "s", "batch_log": "b", "run_dir": "r",
                                                    "launcher": "srun", "procs_per_node": 1, "nodes": 1}))
    os.symlink(tmp_path / "real.json", jobs / "7.json")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "XDG_STATE_HOME": str(tmp_path / "state")}
    proc = subprocess.run([sys.executable, "-m", "clusterddp", "status"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60, env=env)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "no jobs submitted with clusterddp here yet" in proc.stderr


@pytest.mark.parametrize("rank_exit, job_exit", [(0, 0), (3, 79)])
def test_a_planted_roll_call_never_fails_a_job_that_succeeded(tmp_path, rank_exit, job_exit):
    """Class 3: the batch script took exit 79 from the presence of stacks/hang-N/rollcall.txt, so a file planted in
    a shared run directory turned a successful job into a 'hung' one. The ranks' exit status now decides; the
    file only explains a step that failed. (The rendered script, run by bash with a stand-in srun.)"""
    from clusterddp.job.spec import JobSpec

    from .cases import run_rendered

    (tmp_path / "plant.py").write_text(
        "import os, pathlib, sys\n"
        "d = pathlib.Path(os.environ['CLUSTERDDP_RUN_DIR']) / 'stacks' / 'hang-0'\n"
        "d.mkdir(parents=True, exist_ok=True)\n(d / 'rollcall.txt').write_text('rank 0 is elsewhere\\n')\n"
        f"sys.exit({rank_exit})\n")
    spec = JobSpec(str(tmp_path / "plant.py"), launcher="srun", gpus_per_node=0, python=sys.executable,
                   output_dir=str(tmp_path / "runs"), requeue=False)
    proc = run_rendered(spec, tmp_path, expect_ok=False)
    assert proc.returncode == job_exit, proc.stdout + proc.stderr
    assert ("hang watchdog ended the job" in proc.stderr) == (job_exit == 79)


@pytest.mark.parametrize("plant", ["another user's", "a link", "group-writable", "a parent others can write"])
def test_a_run_directory_that_is_not_the_jobs_own_is_refused(tmp_path, plant):
    """Class 3: `mkdir -p` took a run directory someone else made first (a predictable name in a shared output
    directory); the batch script and the local backend now refuse one that is a link, another user's, or writable
    by others, before any rank writes into it. Issue 41: or one below a directory others can write without the
    sticky bit (they could rename it after the check and put theirs in its place)."""
    from clusterddp.backends.local.plan import make_plan
    from clusterddp.backends.local.run import run_plan
    from clusterddp.errors import LocalRunError
    from clusterddp.job.spec import JobSpec

    from .cases import run_rendered

    if plant == "another user's" and os.geteuid() != 0:
        pytest.skip("making a directory of another user needs root")
    (tmp_path / "t.py").write_text("print('ran')\n")
    runs = tmp_path / "runs"
    runs.mkdir()
    run_dir = runs / "t-4242"
    if plant == "a link":
        (tmp_path / "elsewhere").mkdir()
        os.symlink(tmp_path / "elsewhere", run_dir)
    else:
        run_dir.mkdir()
        if plant == "another user's":
            os.chown(run_dir, 65534, 65534)
        elif plant == "group-writable":  # (a group of others': a user-private group is the user's alone)
            run_dir.chmod(0o775)
            os.chown(run_dir, -1, 65534)
        else:
            runs.chmod(0o777)
    spec = JobSpec(str(tmp_path / "t.py"), launcher="srun", gpus_per_node=0, python=sys.executable,
                   output_dir=str(runs), requeue=False)
    proc = run_rendered(spec, tmp_path, expect_ok=False)
    assert proc.returncode == 1 and "is not this job's own" in proc.stderr, proc.stdout + proc.stderr
    if plant == "a parent others can write":
        assert f"({runs} above it is writable by group and others, who could swap it)" in proc.stderr, proc.stderr
    assert not any(run_dir.iterdir()) and "ran" not in proc.stdout
    plan = make_plan(spec, str(run_dir), 20011, 1, [])
    with pytest.raises(LocalRunError, match="is not this job's own"):
        run_plan(plan, quiet=True, echo=lambda _: None, note=lambda _: None)
