"""Issue 58: a training script that checkpoints to a directory relative to its working directory (--ckpt-dir ckpt,
the most common form in public scripts), as a sweep's trials share their working directory. One weight w, loss
(w - 1)^2 before each step, plain SGD at --lr from w = 0: step k's loss is (1 - 2 lr)^(2 (k - 1)) exactly, so a
trial's losses tell which learning rate trained it, from which step. --fail-once LR:STEP: the run with that learning
rate fails once after step STEP's checkpoint (a marker file in the working directory remembers)."""
import argparse
import os
import sys

import torch

from clusterddp import runtime

p = argparse.ArgumentParser()
p.add_argument("--lr", type=float, required=True)
p.add_argument("--steps", type=int, default=6)
p.add_argument("--ckpt-dir", default="ckpt")
p.add_argument("--fail-once", default="")
p.add_argument("--start-from", default=None)
a = p.parse_args()
runtime.init()
model = torch.nn.Linear(1, 1, bias=False)
with torch.no_grad():
    model.weight.zero_()
# (one rank: no DDP, whose construction imports torch._dynamo; what is tested is whose checkpoints these are)
opt = torch.optim.SGD(model.parameters(), lr=a.lr)
ckpt = runtime.Checkpointer(a.ckpt_dir)
state = ckpt.load_latest(model, opt, start_from=a.start_from)
x = torch.ones(1, 1)
for step in range((state["step"] if state else 0) + 1, a.steps + 1):
    opt.zero_grad()
    loss = ((model(x) - 1.0) ** 2).mean()
    loss.backward()
    opt.step()
    runtime.report(step=step, loss=loss.item())
    ckpt.save(step, model, opt)
    marker = f"failed-once-{a.lr}"
    if a.fail_once == f"{a.lr}:{step}" and not os.path.exists(marker):
        open(marker, "w").close()
        sys.exit(f"lr {a.lr} fails once after step {step}'s checkpoint, by design")
runtime.shutdown()
