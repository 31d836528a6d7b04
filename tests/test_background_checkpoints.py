"""Checkpointer(background=True): save() returns after a copy in memory and rank 0 writes it on a thread; the
copy is the state at save(), and a write that fails is an error on every rank (issue 25, point 8). The resume of a
killed job from such checkpoints, bit for bit: tests/test_requeue.py."""
from __future__ import annotations

import re

import pytest

from .conftest import SCRIPTS, run_cli


@pytest.mark.ranks
def test_a_failed_background_write_is_an_error_on_every_rank(tmp_path):
    """Rank 0's background write fails; all 4 ranks raise, at the next should_stop() and at shutdown()."""
    proc = run_cli("submit", "--local", "--launcher", "srun", "--nodes", "2", "--procs-per-node", "2",
                   "--output-dir", str(tmp_path / "runs"), str(SCRIPTS / "ckpt_background.py"), "--",
                   "--dir", str(tmp_path / "ck"), cwd=tmp_path, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for where, step in (("should_stop", 2), ("shutdown", 4)):
        raised = re.findall(rf"^\[rank (\d)\] RAISED {where} (.*)$", proc.stdout, re.M)
        assert sorted(int(r) for r, _ in raised) == [0, 1, 2, 3], proc.stdout
        path = tmp_path / "ck" / f"ckpt-{step:010d}.pt"
        assert {m for _, m in raised} == {f"the checkpoint {path} could not be written by rank 0 (FileExistsError: "
                                          f"[Errno 17] File exists: '{tmp_path / 'ck'}'); the checkpoints before it "
                                          "are untouched"}, raised


@pytest.mark.ranks
def test_a_failed_last_write_fails_a_script_that_never_calls_shutdown(tmp_path):
    """Issue 41: the script returns without shutdown() while its last background write fails: the process exits
    with 1 and says which checkpoint (it once exited 0, the failure unseen)."""
    import os
    import subprocess
    import sys

    from .conftest import ROOT

    proc = subprocess.run([sys.executable, str(SCRIPTS / "ckpt_background.py"), "--dir", str(tmp_path / "ck"),
                           "--no-shutdown"], capture_output=True, text=True, timeout=180,
                          env={"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT)})
    assert "RETURNED without shutdown" in proc.stdout, proc.stdout + proc.stderr
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert (f"clusterddp: the checkpoint {tmp_path / 'ck' / 'ckpt-0000000004.pt'} could not be written by rank 0 "
            "(FileExistsError") in proc.stderr and "exiting with 1" in proc.stderr, proc.stderr


def test_a_background_save_keeps_the_state_of_its_step(tmp_path):
    """save() returns before the write; the parameters change at once; what is on disk is the state at save()."""
    import torch

    from clusterddp import runtime

    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    momentum = opt.state_dict()["state"][0]["momentum_buffer"].clone()
    ckpt = runtime.Checkpointer(str(tmp_path / "ck"), background=True)
    try:
        path = ckpt.save(7, model, opt)
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(-3.0)
        opt.state[model.weight]["momentum_buffer"].add_(5.0)
        ckpt.wait()
        saved = torch.load(path, weights_only=True)
    finally:
        runtime.shutdown()
    assert saved["step"] == 7
    assert all(torch.equal(saved["model"][k], before[k]) for k in before)
    assert torch.equal(saved["optimizer"]["state"][0]["momentum_buffer"], momentum)
    assert not torch.equal(model.weight, before["weight"])


# Issue 79: these local jobs test what the ranks do, not their cold start (conftest.warm_start).
pytestmark = pytest.mark.usefixtures("warm_start")
