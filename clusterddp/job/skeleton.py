"""The DDP training skeleton written by ``clusterddp new TRAIN.py``."""

SKELETON = '''"""A DDP training script made by `clusterddp new`. Replace the toy model and data with yours.

Run it:
    python {name}                                                  # one process
    clusterddp submit --local --procs-per-node 2 {name}            # 2 ranks on this machine, CPU
    clusterddp submit --nodes 2 --gpus 8 --time 1:00:00 {name}     # 16 GPUs on Slurm
"""
import argparse
import os

import torch
import torch.nn as nn
from torch.utils.data import TensorDataset

from clusterddp import runtime


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=32, help="per rank: the global batch is this x world size")
    p.add_argument("--lr", type=float, default=1e-2)
    args = p.parse_args()

    # 1. One line instead of process-group boilerplate: ranks, devices and backend come from the launcher.
    #    allow_single=True lets a plain `python {name}` run as one process.
    env = runtime.init(allow_single=True)
    torch.manual_seed(0)

    # 2. Your data. Every rank builds the same dataset; runtime.loader gives each rank its own share
    #    (DistributedSampler) and reshuffles every epoch without a set_epoch call.
    x = torch.randn(2048, 16)
    y = x @ torch.randn(16, 1) + 0.1 * torch.randn(2048, 1)
    data = runtime.loader(TensorDataset(x, y), batch_size=args.batch_size)

    # 3. Your model: runtime.wrap moves it to this rank's device and wraps it in DistributedDataParallel
    #    (where a single-GPU script would write nn.DataParallel(model)).
    model = runtime.wrap(nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    dev = runtime.device()

    for epoch in range(args.epochs):
        total = 0.0
        for xb, yb in data:
            xb, yb = xb.to(dev), yb.to(dev)
            loss = nn.functional.mse_loss(model(xb), yb)
            opt.zero_grad()
            loss.backward()          # DDP averages the gradients of all ranks here
            opt.step()
            runtime.step()           # one step done: what `clusterddp top` and `report` count
            total += loss.item()
        # 4. Metrics: average over ranks; print once (rank 0); record it (the loss curve of `clusterddp report`).
        mean = runtime.all_reduce_mean(total / len(data))
        runtime.print0(f"epoch {{epoch + 1}}/{{args.epochs}} loss {{mean:.4f}} (world size {{env.world_size}})")
        runtime.report(step=epoch + 1, loss=mean)
        # 5. Save on rank 0 only, atomically; runtime.unwrap drops the DDP wrapper from the state dict.
        runtime.save_on_main(runtime.unwrap(model).state_dict(),
                             os.path.join(os.environ.get("CLUSTERDDP_RUN_DIR", "."), "model.pt"))
    runtime.shutdown()


if __name__ == "__main__":
    main()
'''
