from collections import defaultdict

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def train_epoch(model, loader, opt, device):
    model.train()
    sums = defaultdict(float)
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        out = model(x)
        loss = nn.functional.cross_entropy(out, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sums["loss"] += loss.item()
        sums["acc"] += (out.argmax(1) == y).float().mean().item()
    return {k: v / len(loader) for k, v in sums.items()}


def main():
    device = torch.device("cuda:0")
    data = TensorDataset(torch.randn(8000, 30), torch.randint(0, 3, (8000,)))
    loader = DataLoader(data, batch_size=80, shuffle=True)
    model = nn.DataParallel(nn.Sequential(nn.Linear(30, 60), nn.ReLU(), nn.Linear(60, 3))).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=5e-3)
    sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, patience=2)
    best, wait, patience = float("inf"), 0, 5
    history = []
    for epoch in range(200):
        metrics = train_epoch(model, loader, opt, device)
        sched.step(metrics["loss"])
        history.append(metrics)
        print(f"epoch {epoch} " + " ".join(f"{k}={v:.4f}" for k, v in metrics.items()))
        if metrics["loss"] < best - 1e-4:
            best, wait = metrics["loss"], 0
            torch.save(model.module.state_dict(), "best.pt")
        else:
            wait += 1
            if wait > patience:
                print(f"no improvement for {patience} epochs, stopping")
                break
    torch.save(history, "history.pt")


if __name__ == "__main__":
    main()
