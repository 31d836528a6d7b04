import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

# "bold driver": grow the lr while the loss falls, halve it when it rises
BASE_LR, GROW, SHRINK = 0.01, 1.05, 0.5

x = torch.randn(10000, 20)
y = torch.sin(x.sum(1, keepdim=True))
loader = DataLoader(TensorDataset(x, y), batch_size=100, shuffle=True)

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = nn.Sequential(nn.Linear(20, 64), nn.Tanh(), nn.Linear(64, 1))
model = nn.DataParallel(model).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=BASE_LR)

lr, prev = BASE_LR, float("inf")
for epoch in range(60):
    total = 0.0
    for xb, yb in loader:
        xb, yb = xb.to(device), yb.to(device)
        loss = nn.functional.mse_loss(model(xb), yb)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total += loss.item() * xb.size(0)
    epoch_loss = total / len(x)
    if epoch_loss > prev:
        lr *= SHRINK
    else:
        lr *= GROW
    for group in optimizer.param_groups:
        group["lr"] = lr
    prev = epoch_loss
    print(f"epoch {epoch} loss {epoch_loss:.5f} next lr {lr:.4f}")

torch.save(model.module.state_dict(), "bold.pt")
