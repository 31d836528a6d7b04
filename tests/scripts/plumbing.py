"""Torch-free test job for what Slurm and the batch script give the ranks (srun launcher): the same RESULT line per
rank as allreduce.py, the sum of rank + 1 over every rank made over plain TCP at MASTER_ADDR:MASTER_PORT.

Importing torch costs each rank 3-3.5 s of CPU on the 2-core test machine; the tests that check the script, the
placement or the port (not training) use this instead. Rank 0 binds MASTER_PORT on its node, so a port another job
holds there fails the job, as it would fail torch's store. ``--fail-rank N``: rank N raises before joining.
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import time

p = argparse.ArgumentParser()
p.add_argument("--fail-rank", type=int, default=-1)
p.add_argument("--echo", nargs="*", default=[])
p.add_argument("--show-step", action="store_true", help="rank 0 adds its step as scontrol shows it")
args = p.parse_args()

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
if rank == args.fail_rank:
    raise RuntimeError(f"deliberate failure on rank {rank}")


def line(sock: socket.socket) -> str:
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(64)
        if not chunk:
            raise ConnectionError("peer closed")
        data += chunk
    return data.decode().strip()


if rank == 0:
    server = socket.create_server(("", port), backlog=world)  # no SO_REUSEPORT: a port in use fails here
    server.settimeout(60)
    peers = [server.accept()[0] for _ in range(world - 1)]
    total = 1.0 + sum(float(line(peer)) for peer in peers)
    for peer in peers:
        peer.sendall(f"{total}\n".encode())
        peer.close()
else:
    deadline = time.monotonic() + 60
    while True:
        try:
            conn = socket.create_connection((addr, port), timeout=10)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    conn.sendall(f"{rank + 1}\n".encode())
    total = float(line(conn))
    conn.close()

cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
result = {
    "rank": rank, "local_rank": int(os.environ["LOCAL_RANK"]), "world_size": world,
    "local_world_size": int(os.environ.get("LOCAL_WORLD_SIZE", -1)), "host": socket.gethostname(),
    "master_addr": addr, "master_port": port, "sum": total, "argv": sys.argv[1:],
    "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"), "node_id": os.environ.get("SLURM_NODEID"),
    "cpus": cpus, "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
    "slurm_cpus_per_task": os.environ.get("SLURM_CPUS_PER_TASK"),
}
if args.show_step and rank == 0:
    step = f"{os.environ['SLURM_JOB_ID']}.{os.environ['SLURM_STEP_ID']}"
    result["step"] = subprocess.run(["scontrol", "--oneliner", "show", "step", step], capture_output=True,
                                    text=True).stdout
sys.stdout.write("RESULT " + json.dumps(result) + "\n")  # one write: ranks share a log
sys.stdout.flush()
