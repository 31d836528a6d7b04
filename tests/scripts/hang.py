"""Test job for hangs: trains a tiny model with clusterddp.runtime; one rank gets stuck on purpose.

--where before-allreduce: the rank sleeps before its first all_reduce (the others wait in it);
--where loader:            the rank blocks in its dataset's __getitem__ mid-epoch;
--where rendezvous:        the rank never calls init();
--where slow:              every step is slow (--step-s, 0.05 s) but advances: never a hang.
--once:                    the rank gets stuck in the first attempt only (its marker file is left in the run dir);
--raise-on-restart N:      from the Nth requeue on (SLURM_RESTART_COUNT), the rank raises a ValueError at step 5;
--steps-log F:             rank 0 appends "RESTART STEP" per step.
"""
import argparse
import os
import time

import torch

from clusterddp import runtime

p = argparse.ArgumentParser()
p.add_argument("--where", default="none", choices=["none", "before-allreduce", "loader", "rendezvous", "slow"])
p.add_argument("--rank", type=int, default=3)
p.add_argument("--steps", type=int, default=1000)
p.add_argument("--step-s", type=float, help="sleep per step (default: 0.05 s with --where slow, else none)")
p.add_argument("--once", action="store_true")
p.add_argument("--raise-on-restart", type=int, default=0)
p.add_argument("--steps-log")
args = p.parse_args()



class Data(torch.utils.data.Dataset):
    def __len__(self):
        return 4096

    def __getitem__(self, i):
        if args.where == "loader" and runtime.rank() == args.rank and self.stuck_after <= 0:
            # (a marker for tests: the other ranks now wait for this one in their next all-reduce)
            marker = os.path.join(os.environ["CLUSTERDDP_RUN_DIR"], f"stuck-rank-{args.rank}")
            if not (args.once and os.path.exists(marker)):
                open(marker, "w").close()
                time.sleep(3600)  # a wedged file system
        self.stuck_after -= 1
        return torch.full((4,), float(i)), torch.tensor(float(i % 3))

    stuck_after = 40


def step(model, opt, x, y):
    loss = torch.nn.functional.mse_loss(model(x).squeeze(-1), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss


def main(local_rank=None):
    if args.where == "rendezvous":  # this rank never reaches init()
        rank = int(os.environ["RANK"]) if local_rank is None else (
            int(os.environ["NODE_RANK"]) * int(os.environ["CLUSTERDDP_PROCS_PER_NODE"]) + local_rank)
        if rank == args.rank:
            time.sleep(3600)
    env = runtime.init()
    print(f"joined rank {env.rank} of {env.world_size}", flush=True)
    if args.where == "before-allreduce" and env.rank == args.rank:
        time.sleep(3600)
    runtime.all_reduce_mean(torch.ones(1))
    model = runtime.wrap(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    data = runtime.loader(Data(), batch_size=4)
    done = 0
    for _epoch in range(100):
        for x, y in data:
            step(model, opt, x, y)
            restart = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
            if args.raise_on_restart and restart >= args.raise_on_restart and env.rank == args.rank and done == 5:
                raise ValueError("a bug met only after the requeue")
            if args.steps_log and env.rank == 0:
                with open(args.steps_log, "a") as f:
                    f.write(f"{restart} {done}\n")
            if args.where == "slow" or args.step_s:
                time.sleep(args.step_s or 0.05)
            done += 1
            if runtime.should_stop() or done >= args.steps:
                runtime.print0(f"finished {done} steps")
                runtime.shutdown()
                return


if __name__ == "__main__":
    if os.environ.get("CLUSTERDDP_LAUNCHER") == "spawn":
        runtime.spawn(main)
    else:
        main()
