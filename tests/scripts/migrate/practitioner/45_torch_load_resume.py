import argparse
import os

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--resume", default="checkpoint.pth")
parser.add_argument("--epochs", type=int, default=40)
args = parser.parse_args()

model = nn.Sequential(nn.Linear(64, 256), nn.BatchNorm1d(256), nn.ReLU(), nn.Linear(256, 8))
model = nn.DataParallel(model).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs)
start_epoch = 0

if os.path.isfile(args.resume):
    print(f"=> loading checkpoint '{args.resume}'")
    checkpoint = torch.load(args.resume)
    model.load_state_dict(checkpoint["state_dict"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    scheduler.load_state_dict(checkpoint["scheduler"])
    start_epoch = checkpoint["epoch"] + 1
    print(f"=> resumed at epoch {start_epoch}")

loader = DataLoader(TensorDataset(torch.randn(16000, 64), torch.randint(0, 8, (16000,))),
                    batch_size=160, shuffle=True, num_workers=4)
for epoch in range(start_epoch, args.epochs):
    model.train()
    for x, y in loader:
        loss = nn.functional.cross_entropy(model(x.cuda()), y.cuda())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    scheduler.step()
    print(f"epoch {epoch} loss {loss.item():.4f}")
    torch.save({"epoch": epoch, "state_dict": model.state_dict(), "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict()}, args.resume)
