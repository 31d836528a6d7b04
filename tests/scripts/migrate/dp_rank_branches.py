"""A DataParallel script whose decisions, once each rank has its own share of the data, differ by rank: a print
only when the loss is high, best-model saving on a metric of the rank's own, a checkpoint helper called under that
test. Written for issue 54: migrated, it must never put a collective (an averaged print, a save that waits for the
others) where only some ranks get: with 4 ranks it would hang at the second epoch."""
import argparse
import os

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=4)
parser.add_argument("--out", default="out")
args = parser.parse_args()


def save_best(net, path):
    torch.save(net.state_dict(), path)


def score(net, loader):
    total = 0.0
    for x, y in loader:
        total += nn.functional.mse_loss(net(x).squeeze(-1), y).item()
    return total / len(loader)


def main():
    torch.manual_seed(0)
    x = torch.randn(256, 8)
    y = x @ torch.linspace(-1, 1, 8) + 0.1 * torch.randn(256)
    data = TensorDataset(x, y)
    model = nn.DataParallel(nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    train = DataLoader(data, batch_size=8, shuffle=True)
    os.makedirs(args.out, exist_ok=True)
    best = float("inf")
    for epoch in range(args.epochs):
        for i, (xb, yb) in enumerate(train):
            loss = nn.functional.mse_loss(model(xb).squeeze(-1), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if i % 2 == 0:
                print(f"epoch {epoch} step {i} loss {loss.item():.4f}")
            if loss.item() > 1.5:
                print(f"a high loss: {loss.item():.4f}")
        here = score(model, train)  # on the rank's own share, once migrated
        print(f"epoch {epoch} score {here:.4f}")
        if here < best:
            best = here
            save_best(model, os.path.join(args.out, "best.pt"))
            torch.save(model.state_dict(), os.path.join(args.out, "best-again.pt"))
    torch.save(model.state_dict(), os.path.join(args.out, "final.pt"))


if __name__ == "__main__":
    main()
