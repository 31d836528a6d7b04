"""Step time with checkpoints every N steps (bench item 12): none, Checkpointer.save written before it returns, and
Checkpointer(background=True). Run by `python -m bench` under torchrun (1 or 2 ranks, CPU, gloo):

    checkpoint_cost.py MODE STEPS EVERY DIR      # MODE: none | sync | background

A wide MLP (about 25 M parameters, Adam: a checkpoint of about 300 MB) so that writing one costs as much as several
steps. Rank 0 prints one JSON line: the mean wall time per step over the measured steps (the first 3 warm up),
checkpoint steps included (in the background: the copies, and the writes' competition for the CPU), the wait for
the last background write at the end (once per run), and how many checkpoints were written.
"""
import json
import os
import sys
import time

import torch
import torch.nn as nn

from clusterddp import runtime

mode, steps, every, directory = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
runtime.init(allow_single=True)
torch.manual_seed(0)
model = runtime.wrap(nn.Sequential(nn.Linear(2048, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(),
                                   nn.Linear(4096, 2048)))
opt = torch.optim.Adam(model.parameters(), lr=1e-4)
ckpt = runtime.Checkpointer(directory, keep=2, background=(mode == "background"))
x, y = torch.randn(32, 2048), torch.randn(32, 2048)
WARMUP = 3
saved = 0
for step in range(1, steps + WARMUP + 1):
    if step == WARMUP + 1:
        runtime.barrier()
        start = time.perf_counter()
    loss = nn.functional.mse_loss(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    if mode != "none" and step > WARMUP and (step - WARMUP) % every == 0:
        ckpt.save(step, model, opt)
        saved += 1
    runtime.should_stop()  # where a script polls it (and where a failed background write would surface)
runtime.barrier()
elapsed = time.perf_counter() - start
ckpt.wait()  # the last background write, once per run: reported on its own
final_wait = time.perf_counter() - start - elapsed
if runtime.is_main():
    size = sum(os.path.getsize(os.path.join(directory, f)) for f in os.listdir(directory)) if saved else 0
    print(json.dumps({"mode": mode, "step_s": elapsed / steps, "final_wait_s": final_wait, "saved": saved,
                      "mb_per_checkpoint": size / max(1, min(saved, 2)) / 1e6}))
runtime.shutdown()
