import argparse
import time

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=50)
parser.add_argument("--max-steps", type=int, default=0, help="0: no limit")
parser.add_argument("--smoke", action="store_true", help="one epoch, then stop")
args = parser.parse_args()

ds = TensorDataset(torch.randn(16384, 24), torch.randn(16384, 3))
loader = DataLoader(ds, batch_size=64, shuffle=True, drop_last=True)
model = nn.DataParallel(nn.Sequential(nn.Linear(24, 96), nn.ReLU(), nn.Linear(96, 3))).cuda()
opt = torch.optim.Adam(model.parameters(), lr=2e-4)

global_step = 0
for epoch in range(args.epochs):
    t0 = time.time()
    for x, y in loader:
        loss = nn.functional.smooth_l1_loss(model(x.cuda()), y.cuda())
        opt.zero_grad()
        loss.backward()
        opt.step()
        global_step += 1
        if args.max_steps and global_step >= args.max_steps:
            break
    print(f"epoch {epoch} ({time.time() - t0:.1f}s) step {global_step} loss {loss.item():.4f}")
    if args.max_steps and global_step >= args.max_steps:
        print("reached --max-steps")
        break
    if args.smoke:
        break
torch.save(model.module.state_dict(), "smooth.pt")
