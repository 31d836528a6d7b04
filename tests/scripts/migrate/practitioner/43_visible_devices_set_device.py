import argparse
import os

parser = argparse.ArgumentParser()
parser.add_argument("--gpus", default="0,1,2,3", help="comma-separated GPU ids")
parser.add_argument("--epochs", type=int, default=10)
args = parser.parse_args()
os.environ["CUDA_VISIBLE_DEVICES"] = args.gpus

import torch  # noqa: E402  (after CUDA_VISIBLE_DEVICES on purpose)
import torch.nn as nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

gpu_ids = list(range(len(args.gpus.split(","))))
torch.cuda.set_device(gpu_ids[0])
torch.backends.cudnn.benchmark = True

data = TensorDataset(torch.randn(12800, 3, 32, 32), torch.randint(0, 10, (12800,)))
loader = DataLoader(data, batch_size=256, shuffle=True, num_workers=8, pin_memory=True)
model = nn.Sequential(nn.Conv2d(3, 64, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                      nn.Flatten(), nn.Linear(64, 10))
model = nn.DataParallel(model, device_ids=gpu_ids).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

for epoch in range(args.epochs):
    for x, y in loader:
        x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"epoch {epoch}: {loss.item():.4f} on GPUs {args.gpus}")
torch.save(model.module.state_dict(), "visible.pt")
