"""A classic DataParallel training script (the kind the seed's user had)."""
import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=16)
    args = p.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(256, 10), torch.randn(256, 1))
    train = DataLoader(data, batch_size=args.batch_size, shuffle=True)   # the training set
    val = DataLoader(data, batch_size=64)
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 1))
    model = nn.DataParallel(model)
    model.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for epoch in range(args.epochs):
        for x, y in train:
            x, y = x.to(device), y.to(device)
            loss = nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch} loss {loss.item():.4f}")
    with torch.no_grad():
        error = sum(nn.functional.mse_loss(model(x.to(device)), y.to(device)).item() for x, y in val)
    print("validation loss", error / len(val))
    torch.save(model.module.state_dict(), "model.pt")


if __name__ == "__main__":
    main()
