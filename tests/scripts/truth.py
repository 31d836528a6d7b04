"""A training loop for the observatory's truth tests (issue 56): what slows it is known, so `top` can be checked.

--slow-rank R --every N --slow-s S: rank R sleeps S seconds inside its forward pass in every N-th step only (an
intermittent straggler). --item-s S: every rank's dataset sleeps S seconds per item, read through a plain
torch DataLoader (not runtime.loader: nothing in it is timed). Every rank sleeps --step-s in its forward pass.
"""
import argparse
import time

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from clusterddp import runtime


class Slow(nn.Module):
    def __init__(self, seconds: float, extra: float, every: int) -> None:
        super().__init__()
        self.seconds, self.extra, self.every, self.calls = seconds, extra, every, 0
        self.layer = nn.Linear(8, 8)

    def forward(self, x):
        self.calls += 1
        time.sleep(self.seconds + (self.extra if self.every and self.calls % self.every == 0 else 0.0))
        return self.layer(x)


class Data(Dataset):
    def __init__(self, n: int, per_item_s: float) -> None:
        g = torch.Generator().manual_seed(5)
        self.x, self.y = torch.randn(n, 8, generator=g), torch.randn(n, 1, generator=g)
        self.per_item_s = per_item_s

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i):
        time.sleep(self.per_item_s)
        return self.x[i], self.y[i]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--step-s", type=float, default=0.02)
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--every", type=int, default=0)
    p.add_argument("--slow-s", type=float, default=0.3)
    p.add_argument("--item-s", type=float, default=0.0)
    a = p.parse_args()
    runtime.init(timeout=120, allow_single=True)
    slow = runtime.rank() == a.slow_rank
    torch.manual_seed(3)
    batch = 4
    model = runtime.wrap(nn.Sequential(Slow(a.step_s, a.slow_s if slow else 0.0, a.every), nn.ReLU(),
                                       nn.Linear(8, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    dataset = Data(batch * runtime.world_size() * a.steps, a.item_s)
    data = DataLoader(dataset, batch_size=batch, sampler=DistributedSampler(dataset, shuffle=False))
    step = 0
    for x, y in data:
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        if runtime.should_stop():
            break
    runtime.print0(f"DONE {step} steps")
    runtime.shutdown()


if __name__ == "__main__":
    main()
