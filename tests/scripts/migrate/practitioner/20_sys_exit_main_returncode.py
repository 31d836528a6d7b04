"""Train a small regressor; exit status 0 if the validation error is acceptable."""
import argparse
import sys

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--max-val-mse", type=float, default=0.5)
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    x = torch.randn(9000, 6)
    y = x[:, :1] * 2 - x[:, 1:2] + 0.05 * torch.randn(9000, 1)
    train_loader = DataLoader(TensorDataset(x[:8000], y[:8000]), batch_size=200, shuffle=True)
    val_loader = DataLoader(TensorDataset(x[8000:], y[8000:]), batch_size=1000)
    model = nn.DataParallel(nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 1))).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    for epoch in range(args.epochs):
        for xb, yb in train_loader:
            loss = nn.functional.mse_loss(model(xb.cuda()), yb.cuda())
            opt.zero_grad()
            loss.backward()
            opt.step()
    with torch.no_grad():
        val_mse = sum(nn.functional.mse_loss(model(xb.cuda()), yb.cuda(), reduction="sum").item()
                      for xb, yb in val_loader) / 1000
    print(f"val mse {val_mse:.4f} (limit {args.max_val_mse})")
    torch.save(model.module.state_dict(), "reg.pt")
    if val_mse > args.max_val_mse:
        print("validation error too high", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
