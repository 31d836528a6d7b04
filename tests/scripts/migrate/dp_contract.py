"""A deterministic DataParallel script for DDP's contract (tests/test_migrate.py): one SGD step on a global batch
of 16; the parameters saved by the one process that writes."""
import sys

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def build():
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 6), torch.randn(64, 1))
    model = nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 1))
    return data, model


def main(out):
    data, model = build()
    loader = DataLoader(data, batch_size=16, shuffle=True)
    model = nn.DataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print("loss", loss.item())
    torch.save(model.module.state_dict(), out)


if __name__ == "__main__":
    main(sys.argv[1])
