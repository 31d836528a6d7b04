"""The DDP training skeleton written by ``clusterddp new TRAIN.py``."""

SKELETON = '''"""A DDP training script made by `clusterddp new`. Replace the toy model and data with yours.

Run it:
    python {name}                                                  # one process
    clusterddp submit --local --procs-per-node 2 {name}            # 2 ranks on this machine, CPU
    clusterddp drill {name} -- --epochs 1 --ckpt-every 4           # prove that it resumes exactly
    clusterddp submit --nodes 2 --gpus 8 --time 1:00:00 {name}     # 16 GPUs on Slurm; requeued at the time limit
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
    p.add_argument("--ckpt-every", type=int, default=50, help="checkpoint every N optimizer steps")
    p.add_argument("--log-every", type=int, default=10, help="print and record the loss every N steps")
    args = p.parse_args()

    # 1. One line instead of process-group boilerplate: ranks, devices and backend come from the launcher.
    #    allow_single=True lets a plain `python {name}` run as one process.
    env = runtime.init(allow_single=True)
    torch.manual_seed(0)
    out = os.environ.get("CLUSTERDDP_RUN_DIR", ".")  # the run directory: kept when the job is requeued

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

    # 4. Resume where the last run of this job stopped (a requeue at the time limit, a lost node), else start:
    #    model, optimizer, the loader's place in its epoch and every random generator are restored. An LR scheduler
    #    or a GradScaler: pass the object to both, load_latest(model, opt, data, sched=sched) and
    #    ckpt.save(step, model, opt, data, sched=sched) (restored exactly, and kept when a node is lost).
    ckpt = runtime.Checkpointer(os.path.join(out, "checkpoints"))
    state = ckpt.load_latest(model, opt, data)
    step = state["step"] if state else 0
    if state:
        runtime.print0(f"resumed at step {{step}} (to start over, remove {{ckpt.directory}})")

    for epoch in range(data.next_epoch, args.epochs):
        for xb, yb in data:
            xb, yb = xb.to(dev), yb.to(dev)
            loss = nn.functional.mse_loss(model(xb), yb)
            opt.zero_grad()
            loss.backward()          # DDP averages the gradients of all ranks here
            opt.step()
            step += 1
            # 5. Metrics: average over ranks; print once (rank 0); record it (the loss curve of `clusterddp report`).
            if step % args.log_every == 0:
                mean = runtime.all_reduce_mean(loss.item())
                runtime.print0(f"epoch {{epoch + 1}}/{{args.epochs}} step {{step}} loss {{mean:.4f}} "
                               f"(world size {{env.world_size}})")
                runtime.report(step=step, loss=mean)
            if step % args.ckpt_every == 0:
                ckpt.save(step, model, opt, data)
            # 6. One step done (what `clusterddp top` counts); True on every rank when the job must stop (the
            #    time limit is near, Ctrl-C): save and return, and the requeued job resumes at this step.
            if runtime.should_stop():
                ckpt.save(step, model, opt, data)
                runtime.shutdown()
                return
    # 7. The trained model, on rank 0 only, atomically; runtime.unwrap drops the DDP wrapper from the state dict.
    runtime.save_on_main(runtime.unwrap(model).state_dict(), os.path.join(out, "model.pt"))
    runtime.shutdown()


if __name__ == "__main__":
    main()
'''
