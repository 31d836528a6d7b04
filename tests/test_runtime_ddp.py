"""clusterddp.runtime with real processes and real gloo process groups (through the local backend)."""
from __future__ import annotations

import json
import re
import sys

import pytest
import torch
import torch.nn as nn

from .conftest import ROOT, SCRIPTS, run_cli


def reference_params(steps: int, world: int):
    """One process, the concatenated batch: what DDP over `world` ranks must reproduce."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(42)
    for _ in range(steps):
        x, y = torch.randn(world * 4, 8, generator=g), torch.randn(world * 4, 1, generator=g)
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return [p.detach() for p in model.parameters()]


@pytest.mark.ranks
@pytest.mark.parametrize("launcher", ["srun", "torchrun"])
def test_ddp_matches_one_process_and_sampler_covers_all(tmp_path, launcher):
    """4 ranks on 2 emulated nodes (with 2 ranks a sum is commutative: an order bug would hide): DDP's parameters
    equal one process's on the concatenated batch; the sampler, the all-reduce helpers, save_on_main, print0."""
    out = tmp_path / "res"
    proc = run_cli("submit", "--local", "--launcher", launcher, "--nodes", "2", "--procs-per-node", "2",
                   "--output-dir", str(tmp_path / "runs"), str(SCRIPTS / "runtime_checks.py"), "--", "--out", str(out),
                   cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    res = [json.loads((tmp_path / f"res-{r}.json").read_text()) for r in range(4)]
    assert [(r["env"]["rank"], r["env"]["node_rank"], r["env"]["local_rank"]) for r in res] == [
        (0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 1, 1)]
    assert all(r["env"]["world_size"] == 4 and r["env"]["num_nodes"] == 2 for r in res)
    ref = reference_params(5, 4)
    for r in res:
        for got, want in zip(r["params"], ref):
            assert torch.allclose(torch.tensor(got), want, atol=1e-6), (got, want)
    # DistributedSampler: each epoch, every index at least once across ranks, the same share each (10 samples on
    # 4 ranks: 3 each, 2 repeated to even them out)
    for epoch in range(2):
        shares = [r["epochs"][epoch] for r in res]
        assert sorted(set(sum(shares, []))) == list(range(10)) and [len(x) for x in shares] == [3] * 4, shares
    # ... and the epoch advanced by itself: a different order in epoch 2
    assert res[0]["epochs"][0] != res[0]["epochs"][1]
    assert [r["mean_f"] for r in res] == [1.5] * 4 and res[0]["mean_t"] == [1.5, 3.0]
    assert [r["is_main"] for r in res] == [True, False, False, False]
    assert all(r["leftovers"] == [] for r in res) and (tmp_path / "ckpt.pt").exists()
    assert torch.load(tmp_path / "ckpt.pt")["rank"] == 0
    assert proc.stdout.count("PRINT0 from 0") == 1 and not re.search(r"PRINT0 from [1-3]", proc.stdout)


@pytest.mark.ranks
def test_plain_python_is_world_size_one(tmp_path):
    import subprocess

    out = tmp_path / "res"
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith(("SLURM_", "RANK", "WORLD_SIZE"))}
    proc = subprocess.run([sys.executable, str(SCRIPTS / "runtime_checks.py"), "--out", str(out), "--allow-single"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    # without allow_single, no silent fallback to one process
    refused = subprocess.run([sys.executable, str(SCRIPTS / "runtime_checks.py"), "--out", str(out)],
                             cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0 and "no distributed environment found" in refused.stderr
    assert proc.returncode == 0, proc.stderr
    res = json.loads((tmp_path / "res-0.json").read_text())
    assert res["env"]["world_size"] == 1 and res["env"]["source"] == "single"
    for got, want in zip(res["params"], reference_params(5, 1)):
        assert torch.allclose(torch.tensor(got), want, atol=1e-6)


@pytest.mark.slow
def test_example_loss_goes_down_on_two_ranks_and_a_longer_run_resumes_from_its_checkpoint(tmp_path):
    proc = run_cli("submit", "--local", "--procs-per-node", "2", "--output-dir", str(tmp_path / "runs"),
                   str(ROOT / "examples" / "train_ddp.py"), "--", "--epochs", "2", "--images", "4", "--depth", "4",
                   "--ckpt-dir", str(tmp_path / "ck"), cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    losses = [float(x) for x in re.findall(r"epoch \d/2 done: loss ([0-9.]+)", proc.stdout)]
    assert len(losses) == 2 and losses[1] < losses[0], proc.stdout
    assert "world size 2" in proc.stdout and "images/s" in proc.stdout and "final loss" in proc.stdout
    assert sorted(p.name for p in (tmp_path / "ck").glob("ckpt-*.pt")) == ["ckpt-0000000004.pt", "ckpt-0000000008.pt"]
    # issue 56: the losses it prints are recorded too (report's curve), at the steps they were printed
    import json
    printed = [float(x) for x in re.findall(r"step \d+/\d+ loss ([0-9.]+)", proc.stdout)]
    recorded = [json.loads(line) for line in next((tmp_path / "runs").glob("*/metrics.jsonl")).read_text().splitlines()]
    assert printed and [round(m["metrics"]["loss"], 5) for m in recorded] == printed, (recorded, proc.stdout)
    # The same job given a third epoch resumes from the newest checkpoint (one job fewer than a run of its own).
    again = run_cli("submit", "--local", "--procs-per-node", "2", "--output-dir", str(tmp_path / "runs"),
                    str(ROOT / "examples" / "train_ddp.py"), "--", "--epochs", "3", "--images", "4", "--depth", "4",
                    "--ckpt-dir", str(tmp_path / "ck"), cwd=tmp_path, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "resuming at step 8" in again.stdout and "epoch 2/3 done" not in again.stdout, again.stdout
    assert "epoch 3/3 done" in again.stdout, again.stdout


@pytest.mark.slow
def test_dp_vs_ddp_reports_cpu_scaling(tmp_path):
    import subprocess

    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "dp_vs_ddp.py"), "--steps", "3", "--warmup", "1",
                           "--depth", "3", "--batch-size", "2"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "no GPU on this machine" in proc.stdout or "nn.DataParallel" in proc.stdout
    assert re.search(r"DDP, 2 (ranks|GPU): +[0-9.]+ images/s +scaling efficiency [0-9.]+", proc.stdout), proc.stdout


@pytest.mark.parametrize("n, batch", [(10, 4), (13, 3), (17, 4), (8, 2)])
def test_drop_last_is_the_data_loader_s_so_no_rank_gets_a_short_batch(monkeypatch, n, batch):
    """Issue 54: drop_last given to the sampler left each rank a short last batch (one sample: BatchNorm raises);
    given to the DataLoader, as in the script before DDP, every batch of every rank is full and every rank has as
    many batches (none waits in an all-reduce the others never reach). 4 ranks, each built as its rank would."""
    from clusterddp.runtime import data
    dataset = torch.utils.data.TensorDataset(torch.arange(n))
    per_rank = []
    for r in range(4):
        monkeypatch.setattr(data, "rank", lambda r=r: r)
        monkeypatch.setattr(data, "world_size", lambda: 4)
        batches = [b[0].tolist() for b in data.loader(dataset, batch_size=batch, drop_last=True)]
        assert all(len(b) == batch for b in batches), (r, batches)
        per_rank.append(batches)
    assert len({len(b) for b in per_rank}) == 1
    assert len(per_rank[0]) == -(-n // 4) // batch  # each rank's padded share, full batches only
    kept = [i for batches in per_rank for b in batches for i in b]
    assert set(kept) <= set(range(n))


def test_a_loader_made_at_epoch_n_starts_in_epoch_n_s_order():
    """Issue 54: a loader the script makes anew every epoch (migrate gives it ``epoch=``) goes through the data in
    that epoch's order, as one loader kept across epochs would, not in epoch 0's order every time."""
    from clusterddp.runtime import data
    dataset = torch.utils.data.TensorDataset(torch.arange(40))
    kept = data.loader(dataset, batch_size=5)
    orders = [[int(i) for b in kept for i in b[0]] for _ in range(3)]
    assert len({tuple(o) for o in orders}) == 3  # a new shuffle every epoch
    for epoch in range(3):
        again = data.loader(dataset, batch_size=5, epoch=epoch)
        assert [int(i) for b in again for i in b[0]] == orders[epoch]


def test_a_checked_epoch_ends_with_its_last_batch(monkeypatch, tmp_path):
    """Issue 54: migrate --check cut each epoch to its first N batches, so a script's last (short) batch, where
    BatchNorm or a reshape fails, was never run. Now: the first N-1 batches, then the epoch's last one."""
    from clusterddp import contract
    from clusterddp.runtime import data
    monkeypatch.setenv(contract.CHECK_STEPS, "3")
    monkeypatch.setenv(contract.RUN_DIR, str(tmp_path))
    dataset = torch.utils.data.TensorDataset(torch.arange(22))
    made = data.loader(dataset, batch_size=4, shuffle=False)
    for _ in range(2):  # every epoch, not only the first
        batches = [b[0].tolist() for b in made]
        assert batches == [[0, 1, 2, 3], [4, 5, 6, 7], [20, 21]], batches


# Issue 79: these local jobs test what the ranks do, not their cold start (conftest.warm_start).
pytestmark = pytest.mark.usefixtures("warm_start")
