import argparse
import os

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def parse():
    p = argparse.ArgumentParser(description="tabular regression")
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--save-dir", default="weights")
    return p.parse_args()


def train(args):
    x = torch.randn(50000, 40)
    y = x @ torch.randn(40, 1) + 0.1 * torch.randn(50000, 1)
    train_loader = DataLoader(TensorDataset(x, y), batch_size=args.batch_size, shuffle=True,
                              num_workers=4, pin_memory=True)
    model = nn.Sequential(nn.Linear(40, 128), nn.ReLU(), nn.Linear(128, 1))
    model = nn.DataParallel(model)
    model.cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10, gamma=0.1)
    for epoch in range(args.epochs):
        for xb, yb in train_loader:
            xb, yb = xb.cuda(non_blocking=True), yb.cuda(non_blocking=True)
            loss = nn.functional.mse_loss(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        scheduler.step()
        print("epoch %d  lr %.4f  loss %.5f" % (epoch, scheduler.get_last_lr()[0], loss.item()))
        if (epoch + 1) % 10 == 0:
            if not os.path.exists(args.save_dir):
                os.makedirs(args.save_dir)
            torch.save(model.module.state_dict(), os.path.join(args.save_dir, f"ep{epoch + 1}.pt"))


if __name__ == "__main__":
    train(parse())
