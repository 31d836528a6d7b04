import argparse
import math

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

p = argparse.ArgumentParser()
p.add_argument("--per-gpu-batch", type=int, default=64)
p.add_argument("--base-lr", type=float, default=0.1, help="lr for a batch of 256")
p.add_argument("--epochs", type=int, default=30)
p.add_argument("--warmup-epochs", type=int, default=2)
args = p.parse_args()

n_gpu = max(1, torch.cuda.device_count())
batch_size = args.per_gpu_batch * n_gpu  # DataParallel splits this over the GPUs
lr = args.base_lr * batch_size / 256  # linear scaling rule

train_set = TensorDataset(torch.randn(32000, 128), torch.randint(0, 100, (32000,)))
loader = DataLoader(train_set, batch_size=batch_size, shuffle=True, num_workers=8, pin_memory=True)
model = nn.Sequential(nn.Linear(128, 1024), nn.ReLU(), nn.Linear(1024, 100))
if n_gpu > 1:
    model = nn.DataParallel(model)
model = model.cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=1e-4)

iters_per_epoch = math.ceil(len(train_set) / batch_size)
warmup = args.warmup_epochs * iters_per_epoch
total = args.epochs * iters_per_epoch


def lr_lambda(it):
    if it < warmup:
        return (it + 1) / warmup
    return 0.5 * (1 + math.cos(math.pi * (it - warmup) / (total - warmup)))


scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)
for epoch in range(args.epochs):
    for x, y in loader:
        loss = nn.functional.cross_entropy(model(x.cuda(non_blocking=True)), y.cuda(non_blocking=True))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
    print(f"epoch {epoch} lr {scheduler.get_last_lr()[0]:.4f} loss {loss.item():.3f}")
torch.save(model.module.state_dict() if n_gpu > 1 else model.state_dict(), "scaled.pt")
