import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=12)
parser.add_argument("--batch-size", type=int, default=256)
parser.add_argument("--max-lr", type=float, default=0.4)
args = parser.parse_args()

train_ds = TensorDataset(torch.randn(25600, 3, 16, 16), torch.randint(0, 10, (25600,)))
train_loader = DataLoader(train_ds, batch_size=args.batch_size, shuffle=True, num_workers=4, drop_last=True)

net = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
                    nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))
if torch.cuda.device_count() > 1:
    net = nn.DataParallel(net)
net = net.cuda()
opt = torch.optim.SGD(net.parameters(), lr=args.max_lr / 25, momentum=0.9, nesterov=True, weight_decay=5e-4)
steps_per_epoch = len(train_ds) // args.batch_size
sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=args.max_lr, total_steps=args.epochs * steps_per_epoch,
                                            pct_start=0.25)

for epoch in range(args.epochs):
    net.train()
    for i, (x, y) in enumerate(train_loader):
        x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
        loss = nn.functional.cross_entropy(net(x), y, label_smoothing=0.1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        if i % 25 == 0:
            print(f"ep {epoch} it {i}/{steps_per_epoch} lr {sched.get_last_lr()[0]:.4f} loss {loss.item():.3f}")

torch.save(net.module.state_dict() if hasattr(net, "module") else net.state_dict(), "onecycle.pt")
