import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def train_one_epoch(model, loader, optimizer, epoch):
    model.train()
    for i, (x, y) in enumerate(loader):
        x, y = x.cuda(), y.cuda()
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if i % 50 == 0:
            print(f"epoch {epoch} it {i} loss {loss.item():.4f}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--out", default="last.pt")
    args = parser.parse_args()

    data = TensorDataset(torch.randn(20000, 64), torch.randint(0, 10, (20000,)))
    loader = DataLoader(data, batch_size=128, shuffle=True, num_workers=2)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
    model = nn.DataParallel(model).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    epoch = 0
    try:
        for epoch in range(args.epochs):
            train_one_epoch(model, loader, optimizer, epoch)
    except KeyboardInterrupt:
        print("interrupted; saving what we have")
    finally:
        torch.save({"epoch": epoch, "model": model.module.state_dict(),
                    "optimizer": optimizer.state_dict()}, args.out)
        print(f"saved {args.out} at epoch {epoch}")


if __name__ == "__main__":
    main()
