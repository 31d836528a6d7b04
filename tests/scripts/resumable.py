"""A deterministic training job that checkpoints when asked to stop and resumes where it stopped.

Rank 0 appends one line per optimizer step to --steps-log ("<restart count> <global step>"); every rank R appends
"<restart count> <global step> <loss as float.hex()>" to --steps-log.rankR; rank 0 writes the final parameters to
--out. A model with several parameter tensors, dropout and SGD with momentum; meant for 4 ranks on 2 nodes, where
the order of a sum is visible (with 2 ranks a + b == b + a hides it). Used by the requeue tests (Slurm and local)
and the background-checkpoint tests (--ckpt-every, --background).
"""
import argparse
import json
import os
import time

import torch
import torch.nn as nn
from torch.utils.data import TensorDataset

from clusterddp import runtime


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ckpt-dir", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--steps-log", required=True)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--step-sleep", type=float, default=0.2)
    p.add_argument("--ckpt-every", type=int, default=0, help="also checkpoint every N steps")
    p.add_argument("--background", action="store_true", help="Checkpointer(background=True)")
    p.add_argument("--save-extra", action="store_true", help="save(..., epoch=E): more than a peer state keeps")
    p.add_argument("--per-rank", action="store_true", help="each rank's loss sum in a per_rank= dict, updated in "
                   "place (load_latest(per_rank=...), every save); written to OUT.rankR.json at the end")
    p.add_argument("--static-graph", action="store_true", help="runtime.wrap(..., static_graph=True)")
    p.add_argument("--flip-bit-when", default="", help="once this file exists, rank 0 flips one bit of a parameter "
                   "after its step (silent data corruption), renames the file to FILE.done and waits 2 s")
    args = p.parse_args()
    runtime.init(timeout=120, allow_single=True)
    torch.manual_seed(1234)
    g = torch.Generator().manual_seed(99)
    data = TensorDataset(torch.randn(192, 6, generator=g), torch.randn(192, 1, generator=g))
    model = runtime.wrap(nn.Sequential(nn.Linear(6, 24), nn.ReLU(), nn.Dropout(0.2), nn.Linear(24, 12), nn.ReLU(),
                                       nn.Linear(12, 1)), static_graph=args.static_graph)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    batches = runtime.loader(data, batch_size=4, seed=7)
    ckpt = runtime.Checkpointer(args.ckpt_dir, keep=2, background=args.background)
    mine = {"loss_sum": 0.0, "steps": 0} if args.per_rank else None
    state = ckpt.load_latest(model, opt, batches, per_rank=mine)
    step = state["step"] if state else 0
    restart = os.environ.get("SLURM_RESTART_COUNT", "0")
    runtime.print0((f"RESUME from step {step} (restart count {restart})" if state else "FRESH start")
                   + f"; tracker run id {os.environ.get('WANDB_RUN_ID')}")
    for _epoch in range(batches.next_epoch, args.epochs):
        for x, y in batches:
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            if mine is not None:
                mine["loss_sum"] += loss.item()
                mine["steps"] += 1
            with open(f"{args.steps_log}.rank{runtime.rank()}", "a") as fh:
                fh.write(f"{restart} {step} {loss.item().hex()}\n")
            if runtime.is_main():
                with open(args.steps_log, "a") as fh:
                    fh.write(f"{restart} {step}\n")
            if args.flip_bit_when and runtime.rank() == 0 and os.path.exists(args.flip_bit_when) and \
                    step % max(1, args.ckpt_every):  # (never where a save follows: the checkpoint stays clean)
                with torch.no_grad():
                    next(model.parameters()).view(-1).view(torch.int32)[0] ^= 1
                os.rename(args.flip_bit_when, args.flip_bit_when + ".done")
                time.sleep(2)  # (the test kills a node in the meantime; under the local runner's 5-s grace)
            # (--per-rank: the sleep, where the tests' kills land, comes after should_stop(), which sends the values to
            # the buddy; a node lost between a step's optimizer step and its should_stop() takes its values with it,
            # and the next attempt resumes from the checkpoint: tested apart)
            time.sleep(0 if mine is not None else args.step_sleep)
            if args.ckpt_every and step % args.ckpt_every == 0:
                ckpt.save(step, model, opt, batches, per_rank=mine, **({"epoch": _epoch} if args.save_extra else {}))
            if runtime.should_stop():
                path = ckpt.save(step, model, opt, batches, per_rank=mine)
                runtime.print0(f"STOPPED at step {step}, checkpoint {path}")
                runtime.shutdown()
                return
            time.sleep(args.step_sleep if mine is not None else 0)
    runtime.save_on_main({k: v.clone() for k, v in runtime.unwrap(model).state_dict().items()}, args.out)
    if mine is not None:
        with open(f"{args.out}.rank{runtime.rank()}.json", "w") as fh:
            json.dump(mine, fh)
    runtime.print0(f"DONE at step {step}")
    runtime.shutdown()


def _spawned(local_rank):
    main()


if __name__ == "__main__":
    if os.environ.get("CLUSTERDDP_LAUNCHER") == "spawn" and "LOCAL_RANK" not in os.environ:
        runtime.spawn(_spawned)  # the spawn launcher: one process a node starts the node's ranks
    else:
        main()
