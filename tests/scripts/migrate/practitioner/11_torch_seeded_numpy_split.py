import argparse

import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset


class NoisyCurves(Dataset):
    """Time series with random jitter added on every read."""

    def __init__(self, series, labels, jitter=0.05):
        self.series, self.labels, self.jitter = series, labels, jitter

    def __len__(self):
        return len(self.series)

    def __getitem__(self, i):
        x = self.series[i] + self.jitter * np.random.randn(*self.series[i].shape).astype("float32")
        return torch.from_numpy(x), int(self.labels[i])


parser = argparse.ArgumentParser()
parser.add_argument("--seed", type=int, default=42)
parser.add_argument("--epochs", type=int, default=20)
args = parser.parse_args()
torch.manual_seed(args.seed)
torch.cuda.manual_seed_all(args.seed)

rng_data = np.random.RandomState(7)  # stands in for the files on disk
series = rng_data.randn(3000, 1, 128).astype("float32")
labels = rng_data.randint(0, 3, 3000)
idx = np.random.permutation(len(series))
tr, va = idx[:2400], idx[2400:]
train_loader = DataLoader(NoisyCurves(series[tr], labels[tr]), batch_size=32, shuffle=True, num_workers=4)
val_loader = DataLoader(NoisyCurves(series[va], labels[va], jitter=0.0), batch_size=128)

model = nn.Sequential(nn.Conv1d(1, 16, 7), nn.ReLU(), nn.AdaptiveMaxPool1d(1), nn.Flatten(), nn.Linear(16, 3))
model = nn.DataParallel(model).cuda()
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
for epoch in range(args.epochs):
    model.train()
    for x, y in train_loader:
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x.cuda()), y.cuda())
        loss.backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        acc = sum((model(x.cuda()).argmax(1).cpu() == y).sum().item() for x, y in val_loader) / len(va)
    print(f"epoch {epoch} loss {loss.item():.4f} val acc {acc:.3f}")
torch.save(model.module.state_dict(), "curves.pt")
