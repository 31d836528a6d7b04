import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


def build_dataloaders(batch_size, workers):
    train_ds = TensorDataset(torch.randn(2048, 20), torch.randint(0, 2, (2048,)))
    valid_ds = TensorDataset(torch.randn(512, 20), torch.randint(0, 2, (512,)))
    train_dl = DataLoader(train_ds, batch_size=batch_size, shuffle=True, num_workers=workers)
    valid_dl = DataLoader(valid_ds, batch_size=batch_size * 2, num_workers=workers)
    return train_dl, valid_dl


def fit(model, opt, train_dl, epochs, device):
    for epoch in range(epochs):
        model.train()
        total, n = 0.0, 0
        for xb, yb in train_dl:
            xb, yb = xb.to(device), yb.to(device)
            loss = F.cross_entropy(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item() * len(xb)
            n += len(xb)
        print(f"epoch {epoch}: train loss {total / n:.4f}")


def evaluate(model, dl, device):
    model.eval()
    correct = 0
    with torch.no_grad():
        for xb, yb in dl:
            correct += (model(xb.to(device)).argmax(1) == yb.to(device)).sum().item()
    return correct / len(dl.dataset)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bs", type=int, default=128)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--epochs", type=int, default=5)
    args = p.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 2))
    if torch.cuda.device_count() > 1:
        model = nn.DataParallel(model)
    model.to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    train_dl, valid_dl = build_dataloaders(args.bs, args.workers)
    fit(model, opt, train_dl, args.epochs, device)
    print(f"valid accuracy {evaluate(model, valid_dl, device):.3f}")
    torch.save(model.state_dict(), "model.pt")


if __name__ == "__main__":
    main()
