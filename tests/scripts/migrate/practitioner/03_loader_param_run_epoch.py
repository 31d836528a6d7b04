import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


class MLP(nn.Module):
    def __init__(self, d_in=32, d_hidden=128, n_out=5):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_in, d_hidden), nn.ReLU(), nn.Linear(d_hidden, n_out))

    def forward(self, x):
        return self.net(x)


def run_epoch(model, loader, criterion, optimizer=None, device="cuda"):
    training = optimizer is not None
    model.train(training)
    total = 0.0
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        with torch.set_grad_enabled(training):
            loss = criterion(model(x), y)
        if training:
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        total += loss.item() * x.size(0)
    return total / len(loader.dataset)


def main():
    train_set = TensorDataset(torch.randn(4000, 32), torch.randint(0, 5, (4000,)))
    val_set = TensorDataset(torch.randn(1000, 32), torch.randint(0, 5, (1000,)))
    train_loader = DataLoader(train_set, batch_size=64, shuffle=True, num_workers=4, pin_memory=True)
    val_loader = DataLoader(val_set, batch_size=256, shuffle=False, num_workers=4)
    model = nn.DataParallel(MLP()).cuda()
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01)
    best = float("inf")
    for epoch in range(30):
        train_loss = run_epoch(model, train_loader, criterion, optimizer)
        val_loss = run_epoch(model, val_loader, criterion)
        print(f"[{epoch:02d}] train {train_loss:.4f}  val {val_loss:.4f}")
        if val_loss < best:
            best = val_loss
            torch.save(model.module.state_dict(), "best.pt")


if __name__ == "__main__":
    main()
