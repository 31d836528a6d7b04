"""Denoising large images with DDP: the training job clusterddp exists for.

Thousands of large procedural images (deterministic by seed, nothing downloaded) are cut into 128x128 patches; a
small convolutional network learns to remove noise. The same code runs as one process, as N ranks on CPU (gloo)
or on GPUs (NCCL, AMP):

    python examples/train_ddp.py --epochs 1                                  # one process
    clusterddp submit --local --nodes 2 --gpus 2 examples/train_ddp.py -- --epochs 2
    clusterddp submit --nodes 4 --gpus 8 --time 2:00:00 examples/train_ddp.py -- --images 20000 --width 64 --depth 17

What DDP needs beyond a single-GPU loop is marked "# DDP:".
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import Dataset

from clusterddp import runtime


class ProceduralPatches(Dataset):
    """Patches of large images that exist only as functions: image i is a sum of random waves and blobs, so any
    patch is computed from its own pixel window (no image is ever built whole, nothing is stored)."""

    def __init__(self, images: int, image_size: int, patch: int, noise: float, seed: int) -> None:
        self.images, self.size, self.patch, self.noise, self.seed = images, image_size, patch, noise, seed
        self.per_side = image_size // patch
        self.per_image = self.per_side ** 2

    def __len__(self) -> int:
        return self.images * self.per_image

    def clean(self, index: int) -> torch.Tensor:
        image, within = divmod(index, self.per_image)
        row, col = divmod(within, self.per_side)
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + image)
        ys = (torch.arange(self.patch) + row * self.patch).float().view(1, -1, 1) / self.size
        xs = (torch.arange(self.patch) + col * self.patch).float().view(1, 1, -1) / self.size
        freq = torch.rand(6, 2, generator=g) * 24 + 2
        phase = torch.rand(6, generator=g) * 2 * math.pi
        colour = torch.rand(6, 3, generator=g) * 2 - 1
        waves = torch.sin(freq[:, 0].view(-1, 1, 1) * ys + freq[:, 1].view(-1, 1, 1) * xs + phase.view(-1, 1, 1))
        img = torch.einsum("khw,kc->chw", waves, colour) / 3
        centres, radii = torch.rand(4, 2, generator=g), torch.rand(4, generator=g) * 0.2 + 0.05
        for (cy, cx), r in zip(centres.tolist(), radii.tolist()):
            img = img + torch.exp(-((ys - cy) ** 2 + (xs - cx) ** 2) / (2 * r * r)).expand(3, -1, -1) * 0.5
        return img.clamp(-1.5, 1.5)

    def __getitem__(self, index: int):
        clean = self.clean(index)
        g = torch.Generator().manual_seed(self.seed * 7919 + index)
        return clean + torch.randn(clean.shape, generator=g) * self.noise, clean


class Denoiser(nn.Module):
    """DnCNN-style: predicts the noise, subtracts it."""

    def __init__(self, width: int, depth: int) -> None:
        super().__init__()
        layers = [nn.Conv2d(3, width, 3, padding=1), nn.ReLU(inplace=True)]
        for _ in range(depth - 2):
            layers += [nn.Conv2d(width, width, 3, padding=1), nn.ReLU(inplace=True)]
        layers.append(nn.Conv2d(width, 3, 3, padding=1))
        self.net = nn.Sequential(*layers)

    def forward(self, noisy: torch.Tensor) -> torch.Tensor:
        return noisy - self.net(noisy)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    size = p.add_argument_group("size knobs (defaults: a 2-rank CPU run in well under a minute; scale up for GPUs)")
    size.add_argument("--images", type=int, default=16, help="number of large images (default 16)")
    size.add_argument("--image-size", type=int, default=512, help="side of each image in pixels (default 512)")
    size.add_argument("--patch", type=int, default=128, help="patch side (default 128)")
    size.add_argument("--width", type=int, default=32, help="channels per conv layer (default 32; GPU: 64)")
    size.add_argument("--depth", type=int, default=6, help="conv layers (default 6; GPU: 17)")
    size.add_argument("--batch-size", type=int, default=8, help="patches per rank per step (default 8)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--max-steps", type=int, default=0, help="stop each epoch after this many steps (0: all)")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--noise", type=float, default=0.2, help="noise standard deviation")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=0, help="DataLoader worker processes per rank")
    p.add_argument("--log-every", type=int, default=4, help="steps between progress lines")
    p.add_argument("--ckpt-dir", default=None,
                   help="checkpoints here; the newest is resumed at start (default: $CLUSTERDDP_RUN_DIR/checkpoints "
                        "or ./checkpoints)")
    p.add_argument("--ckpt-every", type=int, default=0, help="also checkpoint every N steps (0: per epoch only)")
    p.add_argument("--keep", type=int, default=2, help="checkpoints kept")
    p.add_argument("--no-amp", action="store_true", help="on GPU, train in fp32 instead of bf16 autocast")
    return p.parse_args(argv)


def main(argv=None) -> float:
    args = parse_args(argv)
    env = runtime.init(allow_single=True)                      # DDP: process group from the launcher's variables
    dev = runtime.device()
    torch.manual_seed(args.seed)
    model = runtime.wrap(Denoiser(args.width, args.depth))     # DDP: instead of nn.DataParallel(model)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    data = ProceduralPatches(args.images, args.image_size, args.patch, args.noise, args.seed)
    batches = runtime.loader(data, batch_size=args.batch_size, seed=args.seed,   # DDP: each rank its share
                             num_workers=args.workers, pin_memory=dev.type == "cuda")
    # bf16 autocast only where the GPU has it natively: is_bf16_supported() alone also counts emulation (pre-Ampere
    # GPUs: V100, T4), where bf16 convolutions run far below fp32 speed.
    native_bf16 = dev.type == "cuda" and torch.cuda.is_bf16_supported(including_emulation=False)
    amp = native_bf16 and not args.no_amp
    # Checkpoints: in the job's run directory, which a requeued Slurm job keeps (same job id).
    ckpt = runtime.Checkpointer(args.ckpt_dir or os.path.join(os.environ.get("CLUSTERDDP_RUN_DIR", "."),
                                                              "checkpoints"), keep=args.keep)
    # The epoch's running loss is state too, and each rank's own (its share's): a run resumed mid-epoch goes on with
    # it (else the reported mean would differ from an uninterrupted run's; `clusterddp drill` at 4 ranks finds such
    # things: saved as extra=, only rank 0's would be kept). One dict, updated in place and given to every save:
    # load_latest fills it, and peer heal keeps it at each step's end (a lost node then costs at most one step).
    mine = dict(epoch=-1, running=0.0, done=0)
    state = ckpt.load_latest(model, opt, batches, per_rank=mine)  # DDP: every rank resumes from the same state
    step = state["step"] if state else 0
    runtime.print0(f"train_ddp: world size {env.world_size} ({env.num_nodes} node(s) x {env.local_world_size}), "
                   f"device {dev.type}, {len(data)} patches of {args.patch}x{args.patch}, "
                   f"{len(batches)} steps per epoch per rank, amp {'on' if amp else 'off'}"
                   + (" (this GPU has no native bf16: fp32)" if dev.type == "cuda" and not native_bf16 else "")
                   + (f"; resuming at step {step} from {state['path']}" if state else ""))
    loss_value, total_images, total_time, stopping, path = float("nan"), 0, 0.0, 0, ""
    for epoch in range(batches.next_epoch, args.epochs):
        model.train()
        start = time.perf_counter()
        seen = 0
        if mine["epoch"] != epoch:                            # (else resumed mid-epoch: its running loss goes on)
            mine.update(epoch=epoch, running=0.0, done=0)
        for noisy, clean in batches:                           # DDP: the sampler's epoch advances by itself
            if args.max_steps and batches.batches_done > args.max_steps:
                break
            noisy, clean = noisy.to(dev, non_blocking=True), clean.to(dev, non_blocking=True)
            with torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=amp):
                loss = F.mse_loss(model(noisy), clean)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            mine["done"] += 1
            seen += noisy.shape[0] * env.world_size
            mine["running"] += loss.item()
            if batches.batches_done % args.log_every == 0:
                rate = seen / (time.perf_counter() - start)
                mean = runtime.all_reduce_mean(mine["running"] / mine["done"])
                runtime.print0(f"epoch {epoch + 1}/{args.epochs} step {batches.batches_done}/{len(batches)} "
                               f"loss {mean:.5f} {rate:.1f} images/s")
                runtime.report(step=step, loss=mean)  # the loss curve of `clusterddp report`
            # periodic: what survives a preemption (at an epoch's last step, the epoch's own checkpoint follows)
            if args.ckpt_every and step % args.ckpt_every == 0 and batches.batches_done < len(batches):
                ckpt.save(step, model, opt, batches, per_rank=mine)
            if runtime.should_stop():                          # time limit or preemption: all ranks agree
                stopping = step
                if batches.batches_done < len(batches):        # (at an epoch's last step, the epoch ends first)
                    path = ckpt.save(step, model, opt, batches, per_rank=mine)
                    break
        if stopping and batches.batches_done < len(batches):
            runtime.print0(f"stopping at step {step} (epoch {epoch + 1}); checkpoint {path}; "
                           "a requeued or re-run job resumes here")
            runtime.shutdown()
            return loss_value
        if dev.type == "cuda":
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - start
        loss_value = runtime.all_reduce_mean(mine["running"] / max(1, mine["done"]))  # DDP: averaged over ranks
        total_images, total_time = total_images + seen, total_time + elapsed
        runtime.print0(f"epoch {epoch + 1}/{args.epochs} done: loss {loss_value:.5f}, "
                       f"{seen / max(elapsed, 1e-9):.1f} images/s")
        path = ckpt.save(step, model, opt, batches, per_rank=mine)  # DDP: rank 0 writes, atomically
        if stopping:
            runtime.print0(f"stopping at step {step}, the end of epoch {epoch + 1}; checkpoint {path}; "
                           "a requeued or re-run job resumes here")
            runtime.shutdown()
            return loss_value
    runtime.print0(f"final loss {loss_value:.5f}; throughput {total_images / max(total_time, 1e-9):.1f} images/s "
                   f"over {env.world_size} rank(s)")
    runtime.shutdown()
    return loss_value


def _spawned(local_rank: int, argv) -> None:
    main(argv)


if __name__ == "__main__":
    if os.environ.get("CLUSTERDDP_LAUNCHER") == "spawn" and "LOCAL_RANK" not in os.environ:
        # The spawn launcher starts one process per node; it starts the node's ranks (mp.spawn pattern).
        runtime.spawn(_spawned, args=(sys.argv[1:],))
    else:
        main()
