import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


class TwoHeads(nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(64, 128), nn.ReLU())
        self.reg = nn.Linear(128, 1)
        self.cls = nn.Linear(128, 5)

    def forward(self, x):
        h = self.trunk(x)
        return self.reg(h), self.cls(h)


data = TensorDataset(torch.randn(10000, 64), torch.randn(10000, 1), torch.randint(0, 5, (10000,)))
loader = DataLoader(data, batch_size=100, shuffle=True)
net = nn.DataParallel(TwoHeads()).cuda()
opt = torch.optim.Adam(net.parameters(), lr=1e-3)
w_cls = 0.5

for epoch in range(15):
    for x, t_reg, t_cls in loader:
        x, t_reg, t_cls = x.cuda(), t_reg.cuda(), t_cls.cuda()
        p_reg, p_cls = net(x)
        loss_reg = nn.functional.mse_loss(p_reg, t_reg)
        loss_cls = nn.functional.cross_entropy(p_cls, t_cls)
        opt.zero_grad()
        # backward each task separately so we can log the trunk's gradient norm per task
        loss_reg.backward(retain_graph=True)
        g_reg = sum(p.grad.norm() ** 2 for p in net.module.trunk.parameters()) ** 0.5
        (w_cls * loss_cls).backward()
        g_all = sum(p.grad.norm() ** 2 for p in net.module.trunk.parameters()) ** 0.5
        opt.step()
    print(f"epoch {epoch} reg {loss_reg.item():.4f} cls {loss_cls.item():.4f} "
          f"|g_reg| {g_reg:.3f} |g_all| {g_all:.3f}")

torch.save(net.module.state_dict(), "two_heads.pt")
