"""Issue 58: a checkpoint belongs to the run that wrote it. A sweep's trials that checkpoint into one directory
relative to their shared working directory each train from step 0 at their own learning rate (the losses say so, in
closed form); a rerun of a failed trial resumes its own checkpoint; another run's checkpoint is named and passed
over, and loaded only when named (start_from). Two runs writing one directory at once are told so before the first
step. Temp files that killed background writes leave are removed at the run's next start."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import ROOT, SCRIPTS, run_cli
from .procs import wait_for


def _losses(run_dir: Path) -> dict:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return {d["step"]: d["metrics"]["loss"] for d in map(json.loads, lines)}


def _expected(lr: float, steps) -> dict:
    return {k: pytest.approx((1 - 2 * lr) ** (2 * (k - 1)), rel=1e-5) for k in steps}


@pytest.mark.ranks
def test_sweep_trials_in_one_checkpoint_directory_each_train_their_own(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    proj = tmp_path / "proj"
    proj.mkdir()
    shutil.copy(SCRIPTS / "ckpt_trial.py", proj)
    shape = ["--gpus", "0", "--procs-per-node", "1", "--launcher", "srun"]
    args = ["sweep", "--local", "--grid", "lr=0.1,0.2", *shape, "ckpt_trial.py", "--", "--lr", "{lr}",
            "--fail-once", "0.2:3"]
    first = run_cli(*args, cwd=proj, timeout=300)
    assert first.returncode == 1 and "trial 1 FAILED" in first.stderr, first.stderr
    rows = json.loads(run_cli("sweep", "status", "ckpt_trial", "--local", "--json", cwd=proj).stdout)
    assert [r["state"] for r in rows] == ["COMPLETED", "FAILED"], rows
    assert _losses(Path(rows[0]["run_dir"])) == _expected(0.1, range(1, 7))
    # Trial 1 found trial 0's ckpt-4..6 in ckpt/: not resumed (that would run no step at lr 0.2), from step 0.
    assert _losses(Path(rows[1]["run_dir"])) == _expected(0.2, range(1, 4)), first.stderr
    said = (Path(rows[1]["run_dir"]) / "rank-0.out").read_text()
    trial0 = said.split("was written by run ", 1)[1].split(",", 1)[0]
    assert trial0.startswith("sweep-ckpt_trial-trial-") and trial0 not in said.split("not this one (", 1)[1][:60]
    assert ("clusterddp: ckpt-0000000006.pt in ckpt was written by run sweep-ckpt_trial-trial-" in said
            and "not loaded (nor 2 more of other runs); this run starts afresh" in said), said
    assert sorted(p.name for p in (proj / "ckpt").glob("*.pt")) == [f"ckpt-{s:010d}.pt" for s in range(1, 7)]

    again = run_cli("sweep", "ckpt_trial", "--rerun", "failed", "--local", cwd=proj, timeout=300)
    assert again.returncode == 0, again.stderr
    rows2 = json.loads(run_cli("sweep", "status", "ckpt_trial", "--local", "--json", cwd=proj).stdout)
    assert [r["state"] for r in rows2] == ["COMPLETED", "COMPLETED"] and rows2[1]["run_dir"] != rows[1]["run_dir"]
    # The rerun resumed its own step 3 (written by the first run of the same trial), then steps 4-6 at lr 0.2.
    assert _losses(Path(rows2[1]["run_dir"])) == _expected(0.2, range(4, 7)), again.stderr
    said = (Path(rows2[1]["run_dir"]) / "rank-0.out").read_text()
    assert "resuming this run's ckpt/ckpt-0000000003.pt" in said, said

    # It wrote its steps 4-6 beside trial 0's (their names held by trial 0's), and pruned only its own.
    names = sorted(p.name for p in (proj / "ckpt").glob("*.pt"))
    tagged = [n for n in names if n.count(".") == 2]
    assert sorted(set(names) - set(tagged)) == [f"ckpt-{s:010d}.pt" for s in (4, 5, 6)] and len(names) == 6, names
    assert [n.split(".")[0] for n in tagged] == [f"ckpt-{s:010d}" for s in (4, 5, 6)] and len(
        {n.split(".")[1] for n in tagged}) == 1, names

    # Naming another run's checkpoint starts from it, and says so; a directory of two runs' is not guessed.
    ambiguous = run_cli("submit", "--local", *shape, "ckpt_trial.py", "--", "--lr", "0.1", "--ckpt-dir", "mine",
                        "--start-from", "ckpt", cwd=proj, timeout=300)
    assert ambiguous.returncode != 0
    run_dir = max((proj / "clusterddp-runs").glob("ckpt_trial-local-*"), key=lambda p: p.stat().st_mtime)
    said = (run_dir / "rank-0.out").read_text()
    assert "start_from 'ckpt' holds checkpoints of 2 runs (" in said and "name the checkpoint file" in said, said
    named = run_cli("submit", "--local", *shape, "--env", "CLUSTERDDP_START_FROM=ckpt/ckpt-0000000006.pt",
                    "ckpt_trial.py", "--", "--lr", "0.1", "--steps", "8", "--ckpt-dir", "mine", cwd=proj, timeout=300)
    assert named.returncode == 0, named.stderr
    run_dir = max((proj / "clusterddp-runs").glob("ckpt_trial-local-*"), key=lambda p: p.stat().st_mtime)
    out = (run_dir / "rank-0.out").read_text()
    assert f"clusterddp: starting from {proj}/ckpt/ckpt-0000000006.pt (step 6, written by run {trial0}" in out, out
    assert _losses(run_dir) == _expected(0.1, (7, 8)), out  # trial 0 (lr 0.1) had done 6 steps
    bad = run_cli("submit", "--local", *shape, "ckpt_trial.py", "--", "--lr", "0.1", "--ckpt-dir", "mine2",
                  "--start-from", "nowhere", cwd=proj, timeout=300)
    assert bad.returncode != 0
    bad_dir = max((proj / "clusterddp-runs").glob("ckpt_trial-local-*"), key=lambda p: p.stat().st_mtime)
    said = (bad_dir / "rank-0.out").read_text()
    assert "start_from 'nowhere' (or $CLUSTERDDP_START_FROM) is neither a checkpoint file nor a directory" in said


def test_two_runs_writing_one_directory_are_told_so(tmp_path, monkeypatch):
    """Each run marks the directory it checkpoints into; a live mark of another run there is named (and a dead
    one of this machine removed)."""
    from clusterddp.runtime import ckptowner

    other = subprocess.Popen([sys.executable, "-c", "import sys, time; from clusterddp.runtime import ckptowner; "
                              "print(ckptowner.claim(sys.argv[1], 'run-a'), flush=True); time.sleep(60)",
                              str(tmp_path)], stdout=subprocess.PIPE, text=True, env={**os.environ,
                                                                                      "PYTHONPATH": str(ROOT)})
    try:
        assert other.stdout.readline().strip() == "[]"
        found = ckptowner.claim(str(tmp_path), "run-b")
        assert len(found) == 1 and found[0].startswith(f"run-a (pid {other.pid} on "), found
    finally:
        other.kill()
        other.wait()
    assert ckptowner.claim(str(tmp_path), "run-c") == [f"run-b (pid {os.getpid()} on {os.uname().nodename})"]
    assert len(list(tmp_path.glob(".clusterddp-writer-*"))) == 2  # run-a's (its process gone) was removed


BIG = r'''
import os, sys, time, torch
from clusterddp import runtime
ck = runtime.Checkpointer(sys.argv[1], background=True)
state = ck.load_latest()
model = torch.nn.Linear(8192, 8192)  # 256 MiB: a write that takes a while (seconds here)
ck.save(1, model)
if sys.argv[2] == "hold":
    time.sleep(60)  # killed while the write is in flight
runtime.shutdown()
'''


@pytest.mark.ranks
def test_temp_files_of_killed_background_writes_go_at_the_next_start(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    ck = run_dir / "checkpoints"
    (tmp_path / "big.py").write_text(BIG)
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT), "CLUSTERDDP_RUN_DIR": str(run_dir)}
    other = ck / ".tmp-0123456789ab-inflight"  # another run's write in flight: never touched
    seen = []
    for _ in range(3):
        before = set(ck.glob(".tmp-*"))
        proc = subprocess.Popen([sys.executable, str(tmp_path / "big.py"), str(ck), "hold"], env=env)
        wait_for(lambda before=before, proc=proc: set(ck.glob(".tmp-*")) - before - {other}
                 or proc.poll() is not None, 120, "a background write to begin", interval=0.01)
        assert proc.poll() is None and not list(ck.glob("ckpt-*.pt"))
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        mine = sorted(p.name for p in ck.glob(".tmp-*") if p != other)
        assert len(mine) == 1 and mine[0] not in seen, mine  # this kill's; the last one's went at this start
        seen.append(mine[0])
        other.touch()
    assert not list(ck.glob("ckpt-*.pt"))  # no write got its name
    done = subprocess.run([sys.executable, str(tmp_path / "big.py"), str(ck), "end"], env=env, timeout=120)
    assert done.returncode == 0
    assert sorted(p.name for p in ck.glob(".tmp-*")) == [other.name]
    assert (ck / "ckpt-0000000001.pt").is_file()


def test_who_resumes_whose_checkpoint():
    """A sweep's trial resumes only its own; any other run resumes any other such run's (one directory is one line
    of work: "run the same command again" resumes), never a trial's; a checkpoint without a run (an older
    clusterddp's) is such a run's."""
    from clusterddp.runtime.ckptowner import Owner, resumable

    trial_a, trial_b, job_x, job_y = Owner("sweep-s-trial-a", True), Owner("sweep-s-trial-b", True), Owner("x"), \
        Owner("y")
    by = {name: {"run": o.run, "trial": o.trial} for name, o in
          (("trial_a", trial_a), ("trial_b", trial_b), ("job_x", job_x), ("job_y", job_y))}
    by.update(old=None, old_manifest={"file": "ckpt-1.pt", "step": 1}, outside={"run": None, "trial": False})
    table = {me: sorted(k for k, record in by.items() if resumable(o, record))
             for me, o in (("trial_a", trial_a), ("job_x", job_x), ("outside", Owner(None)))}
    assert table == {"trial_a": ["trial_a"],
                     "job_x": ["job_x", "job_y", "old", "old_manifest", "outside"],
                     "outside": ["job_x", "job_y", "old", "old_manifest", "outside"]}


# Issue 79: these local jobs test what the ranks do, not their cold start (conftest.warm_start).
pytestmark = pytest.mark.usefixtures("warm_start")
