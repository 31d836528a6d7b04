"""The training loop of examples/train_ddp.py written with raw torch.distributed (the runtime-overhead baseline)."""
import argparse
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
from train_ddp import Denoiser, ProceduralPatches  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    for name, default in (("--images", 16), ("--image-size", 512), ("--patch", 128), ("--width", 32), ("--depth", 6),
                          ("--batch-size", 8), ("--epochs", 2), ("--seed", 0), ("--workers", 0)):
        p.add_argument(name, type=int, default=default)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--noise", type=float, default=0.2)
    args = p.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    cuda = torch.cuda.is_available()
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % max(1, torch.cuda.device_count())) \
        if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world, timeout=timedelta(seconds=300))
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    torch.manual_seed(args.seed)
    model = DDP(Denoiser(args.width, args.depth).to(dev), device_ids=[dev.index] if cuda else None)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    data = ProceduralPatches(args.images, args.image_size, args.patch, args.noise, args.seed)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, seed=args.seed)
    batches = DataLoader(data, batch_size=args.batch_size, sampler=sampler, num_workers=args.workers,
                         pin_memory=cuda)  # as the example's runtime.loader
    images, elapsed = 0, 0.0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        start = time.perf_counter()
        for noisy, clean in batches:
            noisy, clean = noisy.to(dev, non_blocking=True), clean.to(dev, non_blocking=True)
            with torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=cuda):  # as the example
                loss = F.mse_loss(model(noisy), clean)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            images += noisy.shape[0] * world
            loss.item()  # as the example, which logs the running loss
        if cuda:
            torch.cuda.synchronize()
        elapsed += time.perf_counter() - start
    if rank == 0:
        print(f"final loss {loss.item():.5f}; throughput {images / elapsed:.1f} images/s over {world} rank(s)")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
