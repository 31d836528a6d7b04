import copy

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


@torch.no_grad()
def ema_update(ema, model, decay):
    for e, p in zip(ema.parameters(), model.parameters()):
        e.mul_(decay).add_(p.detach(), alpha=1 - decay)
    for e, b in zip(ema.buffers(), model.buffers()):
        e.copy_(b)


net = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
                    nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))
model = nn.DataParallel(net).cuda()
ema = copy.deepcopy(model)
for p in ema.parameters():
    p.requires_grad_(False)

train = DataLoader(TensorDataset(torch.randn(8000, 3, 32, 32), torch.randint(0, 10, (8000,))),
                   batch_size=128, shuffle=True, num_workers=4, drop_last=True)
test = DataLoader(TensorDataset(torch.randn(1000, 3, 32, 32), torch.randint(0, 10, (1000,))), batch_size=500)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-4)

for epoch in range(30):
    model.train()
    for x, y in train:
        loss = nn.functional.cross_entropy(model(x.cuda()), y.cuda())
        opt.zero_grad()
        loss.backward()
        opt.step()
        ema_update(ema.module, model.module, decay=0.999)
    ema.eval()
    with torch.no_grad():
        acc = sum((ema(x.cuda()).argmax(1).cpu() == y).sum().item() for x, y in test) / 1000
    print(f"epoch {epoch}: loss {loss.item():.3f}  ema acc {acc:.3f}")
torch.save({"model": model.module.state_dict(), "ema": ema.module.state_dict()}, "ema_ckpt.pt")
