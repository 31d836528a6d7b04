# A DataParallel script with what migrate must not touch: gradient accumulation, a custom sampler, device counts,
# .cuda() calls, no main guard.
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, RandomSampler, TensorDataset

ACCUM = 4
gpus = torch.cuda.device_count()
data = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
loader = DataLoader(data, batch_size=8, sampler=RandomSampler(data))
model = torch.nn.DataParallel(nn.Linear(8, 1), device_ids=list(range(gpus))).cuda()
opt = torch.optim.Adam(model.parameters())
for i, (x, y) in enumerate(loader):
    x, y = x.cuda(non_blocking=True), y.cuda()
    loss = nn.functional.mse_loss(model(x), y) / ACCUM
    loss.backward()
    if (i + 1) % ACCUM == 0:
        opt.step()
        opt.zero_grad()
