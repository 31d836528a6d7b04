"""Runs under any launcher with 2+ ranks: exercises clusterddp.runtime and writes what it saw to --out-<rank>.json."""
import argparse
import json
import os

import torch
import torch.nn as nn
from torch.utils.data import Dataset

from clusterddp import runtime


class Indices(Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--allow-single", action="store_true", help="a plain `python` run is world size 1")
    args = p.parse_args()
    with runtime.init(timeout=60, allow_single=args.allow_single) as env:
        torch.manual_seed(0)
        model = runtime.wrap(nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1)))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(42)
        for _step in range(args.steps):
            # every rank builds the same global batch and trains on its own slice of it
            x = torch.randn(env.world_size * 4, 8, generator=g)
            y = torch.randn(env.world_size * 4, 1, generator=g)
            mine = slice(env.rank * 4, (env.rank + 1) * 4)
            loss = nn.functional.mse_loss(model(x[mine]), y[mine])
            opt.zero_grad()
            loss.backward()
            opt.step()
        params = [p.detach().tolist() for p in runtime.unwrap(model).parameters()]
        data = runtime.loader(Indices(10), batch_size=3, shuffle=True, seed=1)
        epochs = [[int(i) for batch in data for i in batch] for _ in range(2)]
        mean_f = runtime.all_reduce_mean(float(env.rank))
        mean_t = runtime.all_reduce_mean(torch.tensor([env.rank, 2.0 * env.rank]))
        runtime.save_on_main({"rank": env.rank, "params": params}, os.path.join(os.path.dirname(args.out), "ckpt.pt"))
        runtime.print0("PRINT0 from", env.rank)
        runtime.barrier()
        leftovers = [f for f in os.listdir(os.path.dirname(args.out)) if f.startswith(".tmp-")]
        with open(f"{args.out}-{env.rank}.json", "w") as fh:
            json.dump({"env": env.__dict__, "params": params, "epochs": epochs, "mean_f": mean_f,
                       "mean_t": mean_t.tolist(), "leftovers": leftovers, "is_main": runtime.is_main()}, fh)
    import torch.distributed as dist

    assert not dist.is_initialized()


if __name__ == "__main__":
    main()
