import sys

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

TARGET = 0.02
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

x = torch.rand(20000, 2) * 4 - 2
y = (x ** 2).sum(1, keepdim=True)
loader = DataLoader(TensorDataset(x, y), batch_size=256, shuffle=True)

model = nn.Sequential(nn.Linear(2, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
if torch.cuda.device_count() > 1:
    model = nn.DataParallel(model)
model.to(device)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)

for epoch in range(1000):
    epoch_loss = 0.0
    for xb, yb in loader:
        xb, yb = xb.to(device), yb.to(device)
        loss = nn.functional.mse_loss(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        epoch_loss += loss.item()
    epoch_loss /= len(loader)
    print(f"epoch {epoch}: {epoch_loss:.5f}")
    if epoch_loss < TARGET:
        print("target reached, saving and exiting")
        torch.save(model.state_dict(), "paraboloid.pt")
        sys.exit(0)

print("did not converge")
sys.exit(1)
