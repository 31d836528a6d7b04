"""A training loop with one rank made slow on purpose, for the observatory's tests.

--slow-rank R --slow compute: rank R sleeps --slow-s seconds inside its forward pass; --slow data: inside its
dataset's __getitem__ (the loader's time). Every rank sleeps --step-s in its forward pass (a step long enough for the
clocks to read). Rank 0 writes the final parameters to --out (torch.save of the state dict). --ckpt-dir: resumable
(checkpoints every --ckpt-every steps and when asked to stop), as a real job is.
"""
import argparse
import time

import torch
import torch.nn as nn
from torch.utils.data import Dataset

from clusterddp import runtime


class Slow(nn.Module):
    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds
        self.layer = nn.Linear(8, 8)

    def forward(self, x):
        time.sleep(self.seconds)
        return self.layer(x)


class Data(Dataset):
    def __init__(self, n: int, per_item_s: float) -> None:
        g = torch.Generator().manual_seed(5)
        self.x, self.y = torch.randn(n, 8, generator=g), torch.randn(n, 1, generator=g)
        self.per_item_s = per_item_s

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i):
        if self.per_item_s:
            time.sleep(self.per_item_s)
        return self.x[i], self.y[i]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--step-s", type=float, default=0.02)
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--slow", choices=("compute", "data"), default="compute")
    p.add_argument("--slow-s", type=float, default=0.05)
    p.add_argument("--out", default="")
    p.add_argument("--ckpt-dir", default="")
    p.add_argument("--ckpt-every", type=int, default=10)
    a = p.parse_args()
    runtime.init(timeout=120, allow_single=True)
    me = runtime.rank()
    slow = me == a.slow_rank
    torch.manual_seed(3)
    batch = 4
    compute_s = a.step_s + (a.slow_s if slow and a.slow == "compute" else 0.0)
    data_s = (a.slow_s / batch) if slow and a.slow == "data" else 0.0
    model = runtime.wrap(nn.Sequential(Slow(compute_s), nn.ReLU(), nn.Linear(8, 16), nn.Linear(16, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    data = runtime.loader(Data(batch * runtime.world_size() * a.steps, data_s), batch_size=batch, seed=1)
    ckpt = runtime.Checkpointer(a.ckpt_dir, keep=2) if a.ckpt_dir else None
    state = ckpt.load_latest(model, opt, data) if ckpt else None
    step = state["step"] if state else 0
    runtime.print0(f"RESUME at step {step}" if state else "FRESH start")
    for x, y in data:
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        if step % 5 == 0:
            runtime.report(step=step, loss=runtime.all_reduce_mean(loss.detach()))
        if ckpt and step % a.ckpt_every == 0:
            ckpt.save(step, model, opt, data)
        if runtime.should_stop():
            if ckpt:
                ckpt.save(step, model, opt, data)
            break
    if a.out and runtime.is_main():
        torch.save(runtime.unwrap(model).state_dict(), a.out)
    runtime.print0(f"DONE {step} steps")
    runtime.shutdown()


if __name__ == "__main__":
    main()
