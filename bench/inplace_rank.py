"""The ranks of bench/inplace_floor.py (issue 55's design (a), measured before it is built): plain torch.distributed
over gloo, no clusterddp. A rank trains an MLP under DDP and logs each step's end; when a peer is lost it stays alive,
aborts the broken group, waits for the new layout (a file the bench writes, as a supervisor would), joins the new
group and sends the state of the last completed step to the newcomers. A standby imports what a rank imports
(torch, DDP's torch._dynamo) and waits for that file to become a rank.

    python bench/inplace_rank.py DIR RANK WORLD PORT     # a rank of a fresh job
    python bench/inplace_rank.py DIR standby NAME        # a standby: its rank comes with the layout
"""
import importlib
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

WIDTH, STEPS = 256, 400


def log(d: str, name: str, what: str) -> None:
    with open(os.path.join(d, f"{name}.log"), "a") as f:
        f.write(f"{time.time():.6f} {what}\n")


def join(rank: int, world: int, port: int) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)


def layout(d: str, name: str) -> dict:
    """The new layout, once the bench has written it: {"port": P, "ranks": {name: rank}}."""
    path = os.path.join(d, "layout.json")
    while not os.path.exists(path):
        time.sleep(0.005)
    plan = json.load(open(path))
    return {"port": plan["port"], "rank": plan["ranks"][name], "world": len(plan["ranks"])}


def share(model: nn.Module, opt: torch.optim.Optimizer, step: int) -> int:
    """Rank 0's parameters, momentum buffers and step count to every rank (newcomers have none): one broadcast each."""
    for p in model.parameters():
        dist.broadcast(p.data, 0)
        buf = opt.state[p].get("momentum_buffer") if p in opt.state else None
        if buf is None:
            buf = torch.zeros_like(p)
            opt.state[p]["momentum_buffer"] = buf
        dist.broadcast(buf, 0)
    t = torch.tensor([step])
    dist.broadcast(t, 0)
    return int(t)


def train(d: str, name: str, model: nn.Module, opt: torch.optim.Optimizer, step: int) -> int:
    """Steps until STEPS; returns the step reached when a peer is lost (raises only for other errors)."""
    ddp = DDP(model)
    g = torch.Generator().manual_seed(dist.get_rank())
    while step < STEPS:
        x, y = torch.randn(64, WIDTH, generator=g), torch.randn(64, 1, generator=g)
        try:
            loss = nn.functional.mse_loss(ddp(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        except RuntimeError as exc:
            log(d, name, f"lost {type(exc).__name__}")
            return step
        step += 1
        log(d, name, f"step {step}")
    return -1


def main() -> None:
    d, who = sys.argv[1], sys.argv[2]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH), nn.ReLU(),
                          nn.Linear(WIDTH, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    if who == "standby":
        name = sys.argv[3]
        importlib.import_module("torch._dynamo")  # DDP's constructor imports it: a warm standby has it already
        log(d, name, "ready")
        plan, step = layout(d, name), 0
    else:
        name, step = f"r{who}", 0
        join(int(who), int(sys.argv[3]), int(sys.argv[4]))
        log(d, name, "joined")
        reached = train(d, name, model, opt, 0)
        if reached < 0:
            return
        # A peer is lost: this process stays. The broken group is aborted (gloo closes its connections, so a
        # survivor still blocked on this one meets the loss too), then the new layout is awaited.
        dist.distributed_c10d._world.default_pg._get_backend(torch.device("cpu")).abort()
        dist.destroy_process_group()
        log(d, name, "left")
        plan, step = layout(d, name), reached
    join(plan["rank"], plan["world"], plan["port"])
    log(d, name, "joined")
    step = share(model, opt, step)
    train(d, name, model, opt, step)


if __name__ == "__main__":
    main()
