"""Loaders returned by a builder of the script; the training set's accuracy divided by its size (issue 75)."""
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
train_set = TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,)))
val_set = TensorDataset(torch.randn(32, 4), torch.randint(0, 2, (32,)))


def make_loaders(batch):
    train_loader = DataLoader(train_set, batch_size=batch, shuffle=True)
    val_loader = DataLoader(val_set, batch_size=batch, shuffle=True)
    return train_loader, val_loader


def main():
    tr, va = make_loaders(8)
    model = nn.DataParallel(nn.Linear(4, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        for x, y in tr:
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        correct = 0
        with torch.no_grad():
            for x, y in va:
                correct += (model(x).argmax(1) == y).sum().item()
        print("acc", correct / len(val_set))
        seen = 0
        for x, y in tr:
            seen += (model(x).argmax(1) == y).sum().item()
        print("train acc", seen / len(train_set))


if __name__ == "__main__":
    main()
