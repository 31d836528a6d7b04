import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

SEED = 1234
torch.manual_seed(SEED)

X = torch.linspace(-3, 3, 4000).unsqueeze(1)
Y = torch.sin(X) + 0.1 * torch.randn_like(X)
perm = torch.randperm(len(X))
train_idx, test_idx = perm[:3200], perm[3200:]
train_loader = DataLoader(TensorDataset(X[train_idx], Y[train_idx]), batch_size=64, shuffle=True)
test_loader = DataLoader(TensorDataset(X[test_idx], Y[test_idx]), batch_size=400)

net = nn.Sequential(nn.Linear(1, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))
net = nn.DataParallel(net, device_ids=[0, 1]).to("cuda")
opt = torch.optim.Adam(net.parameters(), lr=3e-3)
sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=200)

for epoch in range(200):
    net.train()
    for xb, yb in train_loader:
        xb = xb.to("cuda") + 0.01 * torch.randn_like(xb, device="cuda")  # input jitter
        pred = net(xb)
        loss = nn.functional.mse_loss(pred, yb.to("cuda"))
        opt.zero_grad()
        loss.backward()
        opt.step()
    sched.step()
    if epoch % 20 == 0:
        net.eval()
        with torch.no_grad():
            test_mse = sum(nn.functional.mse_loss(net(x.to("cuda")), y.to("cuda"), reduction="sum").item()
                           for x, y in test_loader) / len(test_idx)
        print(f"epoch {epoch:3d} train {loss.item():.5f} test {test_mse:.5f}")

torch.save(net.module.state_dict(), "sine.pt")
