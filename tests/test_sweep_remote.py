"""Issue 27 with --cluster: a sweep submitted over SSH (tests/test_remote.py's login node) is one array there;
`sweep status` asks that cluster's squeue once and copies the trials' small files back in one rsync; --rerun
refuses while the code here differs from what the trials were submitted with, and reruns once it is that code."""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from .conftest import SCRIPTS, run_cli
from .test_remote import laptop, login  # noqa: F401  (fixtures)

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.slurm_releases("24.11", "26.05")]
SWEEP = ["sweep", "--cluster", "tc", "--name", "far", "--grid", "lr=0.1,0.2", "--grid", "seed=0", "--nodes", "1",
         "--gpus", "0", "--procs-per-node", "2", "--launcher", "srun", "--time", "5",
         "trial.py", "--", "--lr", "{lr}", "--seed", "{seed}", "--fail-when", "0.2,0"]


def wait_rows(proj, env, timeout=240):
    deadline = time.monotonic() + timeout
    while True:
        proc = run_cli("sweep", "status", "far", "--json", cwd=proj, env=env)
        assert proc.returncode == 0, proc.stderr
        rows = json.loads(proc.stdout)
        if all(r["state"] in ("COMPLETED", "FAILED") for r in rows) or time.monotonic() > deadline:
            return rows
        time.sleep(2)


def test_a_remote_sweep_reports_and_reruns_from_the_submitted_code(laptop):  # noqa: F811
    proj, env, remote_code = laptop
    shutil.copy(SCRIPTS / "trial.py", proj)
    sub = run_cli(*SWEEP, cwd=proj, env=env, timeout=300)
    assert sub.returncode == 0, sub.stderr
    array = sub.stdout.split()[0]
    rows = wait_rows(proj, env)
    assert [(r["params"]["lr"], r["state"], r["job"]) for r in rows] == [
        ("0.1", "COMPLETED", f"{array}_0"), ("0.2", "FAILED", f"{array}_1")]
    assert rows[0]["last"]["loss"] == pytest.approx(0.1 + 0.5)
    run_dir = remote_code / "clusterddp-runs" / "sweep-far" / Path(rows[0]["run_dir"]).name  # (its copy there)
    seen = json.loads((run_dir / "seen.json").read_text())
    assert seen["array_job"] == array and "/.snapshots/" in seen["cwd"]
    trial = proj / "trial.py"
    original = trial.read_text()
    trial.write_text(original + "# edited\n")
    refused = run_cli("sweep", "far", "--rerun", "failed", "--cluster", "tc", cwd=proj, env=env)
    assert refused.returncode == 2 and "differs from what the trials of sweep far were submitted with" in refused.stderr
    trial.write_text(original)
    again = run_cli("sweep", "far", "--rerun", "failed", "--cluster", "tc", cwd=proj, env=env, timeout=300)
    assert again.returncode == 0 and "1 trial(s) submitted as array job" in again.stderr, again.stderr
    rows2 = wait_rows(proj, env)
    assert rows2[1]["state"] == "FAILED" and rows2[1]["job"] == f"{again.stdout.split()[0]}_1"
    assert rows2[0] == rows[0]
