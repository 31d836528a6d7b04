"""Submit a DDP function job from Python (notebooks, scripts) through submitit, with clusterddp's JobSpec.

    python examples/submit_with_python.py                  # Slurm when sbatch is on PATH, else this machine
    python examples/submit_with_python.py --backend local  # always this machine (submitit's local executor)

train(cfg) runs on every rank; the job's result is rank 0's return value.
"""
import argparse
import socket

import clusterddp


def train(cfg):
    import torch
    import torch.distributed as dist

    from clusterddp import runtime

    env = runtime.init(timeout=120)          # rank, world size, MASTER_ADDR/PORT from the job
    total = torch.tensor([float(env.rank + 1)])
    dist.all_reduce(total)                   # 1 + 2 + ... + world size
    runtime.shutdown()
    return {"rank": env.rank, "world_size": env.world_size, "host": socket.gethostname(), "sum": total.item(),
            "lr": cfg["lr"]}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", default="auto", choices=["auto", "slurm", "local"])
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--gpus", type=int, default=2, help="GPUs (ranks) per node")
    p.add_argument("--partition", default=None)
    args = p.parse_args()
    spec = clusterddp.JobSpec(nodes=args.nodes, gpus_per_node=args.gpus, time="00:10:00", partition=args.partition)
    job = clusterddp.submit_function(train, spec, {"lr": 0.1}, backend=args.backend)
    print(f"submitted {job}")
    print("rank 0 returned:", job.result())
    for r in job.results():
        print(f"  rank {r['rank']} of {r['world_size']} on {r['host']}: all-reduce sum {r['sum']}")
    sweep = clusterddp.map_array(train, spec, [{"lr": 0.1}, {"lr": 0.01}], max_parallel=2, backend=args.backend)
    print("sweep:", [(j.job_id, j.result()["lr"]) for j in sweep])


if __name__ == "__main__":
    main()
