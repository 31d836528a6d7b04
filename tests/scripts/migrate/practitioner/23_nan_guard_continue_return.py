import math

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def train(model, loader, optimizer, epochs, max_bad=20):
    bad_batches = 0
    for epoch in range(epochs):
        for step, (x, y) in enumerate(loader):
            x, y = x.cuda(), y.cuda()
            logits = model(x)
            loss = nn.functional.binary_cross_entropy_with_logits(logits, y)
            if not math.isfinite(loss.item()):
                bad_batches += 1
                print(f"non-finite loss at epoch {epoch} step {step}; skipping batch")
                if bad_batches > max_bad:
                    print("too many bad batches, giving up")
                    return False
                continue
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
        print(f"epoch {epoch} loss {loss.item():.4f}")
    return True


if __name__ == "__main__":
    x = torch.randn(12000, 50)
    x[torch.rand(12000) < 0.001] = float("inf")  # a few corrupt rows, as in the real data
    y = (x[:, :1] > 0).float()
    loader = DataLoader(TensorDataset(x, y), batch_size=64, shuffle=True)
    model = nn.Sequential(nn.Linear(50, 100), nn.ReLU(), nn.Linear(100, 1))
    model = nn.DataParallel(model).cuda()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    ok = train(model, loader, optimizer, epochs=10)
    if ok:
        torch.save(model.module.state_dict(), "model.pt")
