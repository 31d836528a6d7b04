"""Issue 56, "the observatory tells the truth in every case", with real jobs: 4 ranks on 2 emulated nodes
(`submit --local`, real gloo, tests/scripts/truth.py). A rank slow in one step of four (the old rule, slower in 75% of
the steps, said "none" while it halved the job's speed) is named by the time it costs; a slow plain torch DataLoader
(the old clock called its time compute) shows as data. The rule's arithmetic: test_observatory.py."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from clusterddp import contract

from .conftest import SCRIPTS, run_cli

pytestmark = pytest.mark.ranks
# srun's emulation: one process per rank (torchrun would add an agent per node, importing torch too; the observatory
# under torchrun is the demo's and the local healing test's)
SHAPE = ["--launcher", "srun", "--nodes", "2", "--procs-per-node", "2"]
STEPS = 24


def run(work: Path, name: str, *args: str) -> dict:
    """The job, then `top --json` over its run directory (and the straggler line `top --once` prints)."""
    env = dict(os.environ)
    env[contract.TELEMETRY] = "1"
    out = work / name
    proc = run_cli("submit", "--local", *SHAPE, "--output-dir", str(out), str(SCRIPTS / "truth.py"), "--",
                   "--steps", str(STEPS), *args, cwd=work, env=env)
    assert proc.returncode == 0, proc.stderr
    assert f"[rank 0] DONE {STEPS} steps" in proc.stdout, proc.stdout
    (run_dir,) = out.glob("truth-local-*")
    shown = run_cli("top", "--json", str(run_dir), cwd=work)
    assert shown.returncode == 0, shown.stderr
    snap = json.loads(shown.stdout)
    assert sorted(r["rank"] for r in snap["ranks"]) == [0, 1, 2, 3] and all(r["steps"] == STEPS for r in snap["ranks"])
    once = run_cli("top", "--once", str(run_dir), cwd=work)
    assert once.returncode == 0, once.stderr
    snap["line"] = once.stdout.splitlines()[-1]
    return snap


def test_a_rank_slow_in_every_fourth_step_is_named_with_what_it_costs(tmp_path):
    """Rank 3 sleeps 0.3 s in its forward pass in steps 4, 8, ..., 24: 1.8 s of a job of about 3 s."""
    snap = run(tmp_path, "intermittent", "--slow-rank", "3", "--every", "4", "--slow-s", "0.3")
    (found,) = [s for s in snap["stragglers"] if s["rank"] == 3]
    assert (found["node"], found["phase"], found["steps"]) == ("local1", "compute", STEPS), snap["stragglers"]
    assert STEPS // 4 <= found["slow_steps"] <= STEPS // 2, found  # its 6 slow steps (a busy machine may add some)
    assert found["lost_pct"] >= 30 and found["excess_s"] >= 0.25, found
    assert [s["rank"] for s in snap["stragglers"]] == [3], snap["stragglers"]
    line = snap["line"]
    assert line.startswith(f"stragglers: rank 3 (local1) costs the job {found['lost_pct']:.0f}% of its time over "
                           f"the last {STEPS} steps (compute): its compute ran over the others' median in "
                           f"{found['slow_steps']} of them (intermittently)"), line
    waits = {r["rank"]: r["comm_pct"] for r in snap["ranks"]}
    assert waits[3] < min(waits[r] for r in (0, 1, 2)), waits  # the others wait for it


def test_a_slow_plain_data_loader_shows_as_data(tmp_path):
    """Every rank's dataset sleeps 20 ms per item (80 ms a batch), read through torch's own DataLoader; the
    forward pass sleeps 5 ms. Data is most of each rank's step, compute a small part."""
    snap = run(tmp_path, "plain", "--item-s", "0.02", "--step-s", "0.005")
    for r in snap["ranks"]:
        assert r["data_pct"] >= 50 and r["compute_pct"] <= 30, snap["ranks"]
        assert r["step_p50_s"] >= 0.08, snap["ranks"]
    assert not [s for s in snap["stragglers"] if s["phase"] == "compute"], snap["stragglers"]
