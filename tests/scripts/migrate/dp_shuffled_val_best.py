"""A DataParallel script of a shape practitioners write (issue 54), ours: a validation loader given shuffle=True,
the best model kept by copying the epoch's checkpoint, its folder made where missing."""
import argparse
import os
import shutil

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def evaluate(model, loader):
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for x, y in loader:
            correct += (model(x).argmax(1) == y).sum().item()
            total += len(y)
    model.train()
    return correct / total


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--out", default="runs")
    args = parser.parse_args()
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(640, 16, generator=g)
    y = (x[:, :4].sum(1) > 0).long()
    train_loader = DataLoader(TensorDataset(x[:512], y[:512]), batch_size=args.batch_size, shuffle=True)
    val_loader = DataLoader(TensorDataset(x[512:], y[512:]), batch_size=32, shuffle=True)
    model = nn.DataParallel(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    if not os.path.exists(args.out):
        os.makedirs(args.out)
    best_acc = 0.0
    for epoch in range(args.epochs):
        total = 0.0
        for xb, yb in train_loader:
            loss = nn.functional.cross_entropy(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.item()
        acc = evaluate(model, val_loader)
        print(f"epoch {epoch} loss {total / len(train_loader):.4f} val acc {acc:.3f}")
        checkpoint = os.path.join(args.out, "checkpoint.pt")
        torch.save(model.state_dict(), checkpoint)
        if acc >= best_acc:
            best_acc = acc
            shutil.copyfile(checkpoint, os.path.join(args.out, "model_best.pt"))
    print(f"best val acc {best_acc:.3f}")


if __name__ == "__main__":
    main()
