"""Issue 27 on the real test cluster: a 12-trial sweep (3 x 4) with --max-parallel 2 in which one configuration
fails by design is one array job; at most 2 trials run at once; `sweep status` shows 11 COMPLETED with their
metrics and 1 FAILED; --rerun failed submits exactly that trial; the identical sweep again submits nothing and the
table stays the same; the script edited after submission changes no queued trial. And MaxArraySize, read from
the cluster, refuses a grid too large before anything is submitted."""
from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from clusterddp.healing import attempts

from .conftest import SCRIPTS, run_cli

pytestmark = [pytest.mark.slurm, pytest.mark.slurm_releases("22.05")]
GRID = ["--grid", "lr=0.1,0.2,0.3", "--grid", "seed=0,1,2,3"]
ARGS = ["trial.py", "--", "--lr", "{lr}", "--seed", "{seed}", "--fail-when", "0.2,3", "--sleep", "0.5"]
SHAPE = ["--nodes", "1", "--gpus", "0", "--procs-per-node", "2", "--launcher", "srun", "--time", "5"]


@pytest.fixture
def project(slurm_env, tmp_path):
    (tmp_path / "proj").mkdir()
    shutil.copy(SCRIPTS / "trial.py", tmp_path / "proj")
    return tmp_path / "proj"


def status(project: Path) -> list:
    proc = run_cli("sweep", "status", "acc", "--json", cwd=project)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def wait_all(project: Path, timeout: float = 400) -> list:
    deadline = time.monotonic() + timeout
    while True:
        rows = status(project)
        if all(r["state"] in ("COMPLETED", "FAILED") for r in rows) or time.monotonic() > deadline:
            return rows
        time.sleep(2)


def most_at_once(rows: list) -> int:
    """The most trials whose step ran at the same moment (from each trial's attempts.tsv)."""
    spans = [(a.start, a.end) for r in rows for a in attempts.read(Path(r["run_dir"]))]
    return max(sum(1 for s, e in spans if s <= t < e) for t, _ in spans)


def test_a_sweep_is_one_array_with_a_results_table_and_reruns_only_what_failed(project):
    trial = project / "trial.py"
    original = trial.read_text()
    sub = run_cli("sweep", *GRID, "--max-parallel", "2", "--name", "acc", *SHAPE, *ARGS, cwd=project)
    assert sub.returncode == 0, sub.stderr
    array = sub.stdout.split()[0]
    assert f"12 trial(s) submitted as array job {array}" in sub.stderr
    trial.write_text(original.replace('"original"', '"edited"'))  # after submission: no queued trial runs this
    rows = wait_all(project)
    states = [r["state"] for r in rows]
    assert states.count("COMPLETED") == 11 and states.count("FAILED") == 1, rows
    failed = next(r for r in rows if r["state"] == "FAILED")
    assert failed["params"] == {"lr": "0.2", "seed": "3"} and failed["job"] == f"{array}_7"
    for r in rows:
        seen = json.loads((Path(r["run_dir"]) / "seen.json").read_text())
        assert seen["array_job"] == array and seen["version"] == "original", r
        assert seen["trial"] == str(r["trial"]) and seen["cwd"] == str(project)  # run where submitted from
        assert seen["argv"][:4] == ["--lr", r["params"]["lr"], "--seed", r["params"]["seed"]]
        params = {"CLUSTERDDP_PARAM_LR": r["params"]["lr"], "CLUSTERDDP_PARAM_SEED": r["params"]["seed"]}
        assert seen["params"] == params
        if r["state"] == "COMPLETED":  # step 2: lr * 1 + seed + the mean rank (0.5)
            assert r["last"]["loss"] == pytest.approx(float(r["params"]["lr"]) + int(r["params"]["seed"]) + 0.5)
            assert r["best"]["loss"] == r["last"]["loss"] and "acc" in r["best"]
        else:
            assert r["last"] == {}
    assert most_at_once(rows) <= 2

    table = run_cli("sweep", "status", "acc", "--sort", "loss", cwd=project)
    assert table.returncode == 0 and "12 trial(s): 11 COMPLETED, 1 FAILED" in table.stdout, table.stdout
    assert table.stdout.splitlines()[2].split()[:4] == ["0", "0.1", "0", "COMPLETED"]  # the lowest loss first

    again = run_cli("sweep", "acc", "--rerun", "failed", cwd=project)
    assert again.returncode == 0, again.stderr
    assert "1 trial(s) submitted as array job" in again.stderr
    second = again.stdout.split()[0]
    assert second != array
    rows2 = wait_all(project)
    rerun = next(r for r in rows2 if r["params"] == {"lr": "0.2", "seed": "3"})
    assert rerun["state"] == "FAILED" and rerun["job"] == f"{second}_7" and rerun["run_dir"] != failed["run_dir"]
    assert json.loads((Path(rerun["run_dir"]) / "seen.json").read_text())["version"] == "original"
    assert [r for r in rows2 if r is not rerun] == [r for r in rows if r is not failed]

    trial.write_text(original)  # the submitted code again: the same trials
    same = run_cli("sweep", *GRID, "--max-parallel", "2", "--name", "acc", *SHAPE, *ARGS, cwd=project)
    assert same.returncode == 0 and same.stdout == "", same.stderr
    assert "nothing to submit: all 12 trial(s) of sweep acc" in same.stderr
    assert status(project) == rows2


def test_trials_cancelled_before_they_ran_are_missing_and_rerun(project):
    held = ["--sbatch-arg=--hold", "--name", "held", "--grid", "lr=0.1,0.2", "--grid", "seed=0", *SHAPE, *ARGS]
    sub = run_cli("sweep", *held, cwd=project)
    assert sub.returncode == 0, sub.stderr
    array = sub.stdout.split()[0]
    rows = json.loads(run_cli("sweep", "status", "held", "--json", cwd=project).stdout)
    assert [r["state"] for r in rows] == ["PENDING", "PENDING"]
    subprocess.run(["scancel", array], check=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        rows = json.loads(run_cli("sweep", "status", "held", "--json", cwd=project).stdout)
        if [r["state"] for r in rows] == ["MISSING", "MISSING"]:
            break
        time.sleep(1)
    assert [r["state"] for r in rows] == ["MISSING", "MISSING"]
    none = run_cli("sweep", "held", "--rerun", "failed", cwd=project)
    assert none.returncode == 0 and "nothing to rerun: no trial of sweep held is failed" in none.stderr
    again = run_cli("sweep", "held", "--rerun", "missing", cwd=project)
    assert again.returncode == 0 and "2 trial(s) submitted as array job" in again.stderr, again.stderr
    second = again.stdout.split()[0]
    rows = json.loads(run_cli("sweep", "status", "held", "--json", cwd=project).stdout)
    assert [(r["state"], r["job"]) for r in rows] == [("PENDING", f"{second}_0"), ("PENDING", f"{second}_1")]
    subprocess.run(["scancel", second], check=True)


def test_more_trials_than_max_array_size_are_refused(project):
    proc = run_cli("sweep", "--grid", "a=" + ",".join(map(str, range(501))), "--grid", "b=0,1", *SHAPE,
                   "trial.py", "--", "--lr", "{a}", "--seed", "{b}", cwd=project)
    assert proc.returncode == 2, proc.stderr  # a usage error: change the request
    assert "the sweep has 1002 trials" in proc.stderr and "MaxArraySize is 1001" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (project / "clusterddp-runs").exists()
