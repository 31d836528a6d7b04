"""A small training script for the drill's tests, correct or with one mistake of the kind the drill finds:

--mistake none       saves and restores everything (model, optimizer, loader, its LR scheduler in extra=)
--mistake scheduler  leaves its LR scheduler out of the checkpoint
--mistake random     adds noise from Python's random, never seeded
--mistake noload     never calls load_latest
--mistake loader     saves the loader position but does not restore it
--mistake nocheckpoint  never saves through the runtime's Checkpointer
--mistake fails      raises at step 3
--mistake crash-resumed  a resumed run raises after its last checkpoint
--mistake stopsave   its save at should_stop() (a path of its own) leaves the LR scheduler out
--mistake schedafter steps its LR scheduler after should_stop() (as the object, --live): its stop save holds it a step
                     behind its other saves, which come after the update
--live               (no mistake) gives its scheduler to save() and load_latest() as the object: peer heal keeps it
--scaler-skip N      (no mistake) trains through a GradScaler (saved as scaler=) whose step N overflows: skipped
Reports the mean loss of every step through runtime.all_reduce_mean; checkpoints every 3 steps and when asked to stop.
"""
import argparse
import random

import torch
import torch.nn as nn
from torch.utils.data import TensorDataset

from clusterddp import runtime

p = argparse.ArgumentParser()
p.add_argument("--mistake", default="none")
p.add_argument("--ckpt-dir", default="ckpt")
p.add_argument("--epochs", type=int, default=2)
p.add_argument("--ckpt-every", type=int, default=3, help="checkpoint every N steps")
p.add_argument("--live", action="store_true")
p.add_argument("--scaler-skip", type=int, default=0)
args = p.parse_args()
args.live = args.live or args.mistake == "schedafter"
after = args.mistake == "schedafter"
env = runtime.init(timeout=120, allow_single=True)
torch.manual_seed(0)
g = torch.Generator().manual_seed(5)
data = TensorDataset(torch.randn(48, 4, generator=g), torch.randn(48, 1, generator=g))
net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
# One rank: DDP adds nothing the drill looks at, and building it imports torch._dynamo (1.7 CPU-s in each run).
model = runtime.wrap(net) if env.world_size > 1 else net
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.9 ** s)  # closed form: a fresh one starts over
batches = runtime.loader(data, batch_size=4, seed=3)
scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10, enabled=bool(args.scaler_skip))
scaled = {"scaler": scaler} if args.scaler_skip else {}
ckpt = runtime.Checkpointer(args.ckpt_dir, keep=2)


def save(step, stopping=False):
    if args.mistake == "nocheckpoint":
        return
    extra = {} if args.mistake == "scheduler" or (stopping and args.mistake == "stopsave") else \
        {"sched": sched if args.live else sched.state_dict()}
    ckpt.save(step, model, opt, batches, **extra, **scaled)


step, state = 0, None
if args.mistake != "noload":
    restore = (model, opt) if args.mistake == "loader" else (model, opt, batches)
    state = ckpt.load_latest(*restore, **({"sched": sched} if args.live else {}), **scaled)
    if state:
        step = state["step"]
        if "sched" in state["extra"] and not args.live:
            sched.load_state_dict(state["extra"]["sched"])
for _epoch in range(batches.next_epoch, args.epochs):
    for x, y in batches:
        if args.mistake == "random":
            x = x + random.random()
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        scaler.scale(loss * (float("inf") if step + 1 == args.scaler_skip else 1.0)).backward()
        scaler.step(opt)  # (disabled: opt.step(); at the overflow: no optimizer step, the scale halved)
        scaler.update()
        if not after:
            sched.step()
        step += 1
        if args.mistake == "fails" and step == 3:
            raise RuntimeError("deliberate failure at step 3")
        runtime.all_reduce_mean(loss.detach())
        if step % args.ckpt_every == 0 and not after:
            save(step)
        if runtime.should_stop():
            save(step, stopping=True)
            runtime.shutdown()
            raise SystemExit(0)
        if after:
            sched.step()
            if step % args.ckpt_every == 0:
                save(step)
save(step)
runtime.shutdown()
if args.mistake == "crash-resumed" and state:
    raise RuntimeError("deliberate failure after the last checkpoint of a resumed run")
