"""The in-job half of bench item 17 (issue 55): optimizer steps timed with peer heal on or off (the job's
CLUSTERDDP_PEER_HEAL), no fault. An MLP of --width, batches of 32 from runtime.loader, SGD with momentum, a
Checkpointer (its load_latest starts the keeping; one save at step 0 checks the step count). Rank 0 writes the
median step time, the median time of the keeper's own hooks in a step, and whether the keeping ran to --out."""
import argparse
import json
import os
import statistics
import time

import torch
import torch.nn as nn
from torch.utils.data import TensorDataset

from clusterddp import runtime
from clusterddp.runtime.state import STATE


def hook_times(marks: list) -> list:
    """Per step: (pre-hook after the keeper's - the one before) + (post-hook after - before), from four marks a step in
    the order the hooks run: before-pre, after-pre, [step], before-post, after-post."""
    return [(marks[i + 1] - marks[i]) + (marks[i + 3] - marks[i + 2]) for i in range(0, len(marks) - 3, 4)]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    runtime.init(allow_single=True)
    torch.manual_seed(0)
    w = args.width
    model = runtime.wrap(nn.Sequential(nn.Linear(w, w), nn.ReLU(), nn.Linear(w, w), nn.ReLU(), nn.Linear(w, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.001, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(4096, w, generator=g), torch.randn(4096, 1, generator=g))
    batches = runtime.loader(data, batch_size=32)
    ckpt = runtime.Checkpointer(os.path.join(os.environ.get("CLUSTERDDP_RUN_DIR", "."), "ck"))
    # Hooks around the keeper's own (registered before and after it: hooks run in that order) time its work per step:
    # CPU time of this thread (wall time would count the moments the other ranks hold the cores).
    marks = []
    opt.register_step_pre_hook(lambda *_: marks.append(time.thread_time()))
    opt.register_step_post_hook(lambda *_: marks.append(time.thread_time()))
    ckpt.load_latest(model, opt, batches)
    opt.register_step_pre_hook(lambda *_: marks.append(time.thread_time()))
    opt.register_step_post_hook(lambda *_: marks.append(time.thread_time()))
    ckpt.save(0, model, opt, batches)
    times = []
    while len(times) < args.steps:
        for x, y in batches:
            began = time.perf_counter()
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            times.append(time.perf_counter() - began)
            if len(times) >= args.steps:
                break
    if runtime.is_main():
        with open(args.out, "w") as fh:
            json.dump({"median_s": statistics.median(times[20:]), "kept": "peer" in STATE,
                       "hooks_s": statistics.median(hook_times(marks)[20:])}, fh)
    runtime.shutdown()


if __name__ == "__main__":
    main()
