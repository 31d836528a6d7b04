"""nn.DataParallel vs DistributedDataParallel on the same model: images/s and DDP's scaling efficiency.

    python examples/dp_vs_ddp.py                 # all GPUs of this machine; on a machine without GPUs: CPU DDP only
    python examples/dp_vs_ddp.py --ranks 2       # CPU: 1 process x 1 thread vs 2 ranks x 1 thread

Scaling efficiency = DDP throughput / (N x one-device throughput): 1.0 is perfect.
"""
from __future__ import annotations

import argparse
import os
import socket
import sys
import time

import torch
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_ddp import Denoiser  # noqa: E402  (the same model as the training example)


def batches(batch: int, patch: int, steps: int, device: torch.device):
    g = torch.Generator().manual_seed(0)
    clean = torch.rand(batch, 3, patch, patch, generator=g)
    return [((clean + 0.2 * torch.randn(clean.shape, generator=g)).to(device), clean.to(device)) for _ in range(steps)]


class Autocast(nn.Module):
    """bf16 autocast entered inside forward. nn.DataParallel runs each replica's forward in a thread of its own,
    and autocast's dtype is per thread: an autocast around the step would reach the replicas as CUDA's default
    (fp16, without a GradScaler) while one GPU and DDP ran bf16. Inside forward, all three run the same."""

    def __init__(self, model: nn.Module, device_type: str, enabled: bool) -> None:
        super().__init__()
        self.model, self.device_type, self.enabled = model, device_type, enabled

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device_type=self.device_type, dtype=torch.bfloat16, enabled=self.enabled):
            return self.model(x)


def timed(model: nn.Module, data, warmup: int, device: torch.device) -> float:
    """images/s of `model` over `data` (after `warmup` untimed steps); AMP, if any, is inside the model."""
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    start, images = 0.0, 0
    for i, (noisy, clean) in enumerate(data):
        if i == warmup:
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
        loss = F.mse_loss(model(noisy).float(), clean)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if i >= warmup:
            images += noisy.shape[0]
    if device.type == "cuda":
        torch.cuda.synchronize()
    return images / (time.perf_counter() - start)


def ddp_worker(rank: int, world: int, port: int, args: argparse.Namespace, results) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    from clusterddp import runtime

    torch.set_num_threads(args.threads)
    runtime.init()
    dev = runtime.device()
    torch.manual_seed(0)
    model = runtime.wrap(Autocast(Denoiser(args.width, args.depth), dev.type, args.amp))
    rate = timed(model, batches(args.batch_size, args.patch, args.steps, dev), args.warmup, dev)
    total = runtime.all_reduce_mean(rate) * world
    if rank == 0:
        results.put(total)
    runtime.shutdown()


def ddp_throughput(world: int, args: argparse.Namespace) -> float:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    mp.start_processes(ddp_worker, args=(world, port, args, results), nprocs=world, start_method="spawn")
    return results.get()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=0, help="DDP ranks (default: all GPUs, or 2 on CPU)")
    p.add_argument("--width", type=int, default=32)
    p.add_argument("--depth", type=int, default=6)
    p.add_argument("--patch", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=8, help="per device (DataParallel gets N x this)")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="CPU threads per process")
    p.add_argument("--no-amp", action="store_true")
    args = p.parse_args()
    gpus = torch.cuda.device_count()
    args.amp = gpus > 0 and not args.no_amp
    torch.set_num_threads(args.threads)
    if gpus == 0:
        n = args.ranks or 2
        print(f"dp_vs_ddp: no GPU on this machine: nn.DataParallel needs CUDA, so only the CPU DDP part runs "
              f"({n} ranks x {args.threads} thread(s) vs 1 process x {args.threads} thread(s))")
        dev = torch.device("cpu")
        torch.manual_seed(0)
        single = timed(Denoiser(args.width, args.depth), batches(args.batch_size, args.patch, args.steps, dev),
                       args.warmup, dev)
        ddp = ddp_throughput(n, args)
        print(f"single process: {single:8.1f} images/s")
        print(f"DDP, {n} ranks:  {ddp:8.1f} images/s   scaling efficiency {ddp / (n * single):.2f}")
        return
    n = args.ranks or gpus
    dev = torch.device("cuda", 0)
    torch.manual_seed(0)
    single = timed(Autocast(Denoiser(args.width, args.depth), "cuda", args.amp).to(dev),
                   batches(args.batch_size, args.patch, args.steps, dev), args.warmup, dev)
    dp_model = nn.DataParallel(Autocast(Denoiser(args.width, args.depth), "cuda", args.amp).to(dev),
                               device_ids=list(range(n)))
    dp = timed(dp_model, batches(args.batch_size * n, args.patch, args.steps, dev), args.warmup, dev)
    ddp = ddp_throughput(n, args)
    print(f"one GPU:                {single:8.1f} images/s (amp {'bf16, all three' if args.amp else 'off'})")
    print(f"nn.DataParallel, {n} GPU: {dp:8.1f} images/s   scaling efficiency {dp / (n * single):.2f}")
    print(f"DDP, {n} GPU:             {ddp:8.1f} images/s   scaling efficiency {ddp / (n * single):.2f}")


if __name__ == "__main__":
    main()
