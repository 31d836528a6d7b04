import argparse
import os
from datetime import datetime

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.tensorboard import SummaryWriter

p = argparse.ArgumentParser()
p.add_argument("--logdir", default="runs")
p.add_argument("--epochs", type=int, default=20)
args = p.parse_args()

run_dir = os.path.join(args.logdir, datetime.now().strftime("%Y%m%d-%H%M%S"))
writer = SummaryWriter(log_dir=run_dir)

train_loader = DataLoader(TensorDataset(torch.randn(10000, 16), torch.randn(10000, 4)),
                          batch_size=100, shuffle=True)
model = nn.DataParallel(nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))).cuda()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
writer.add_graph(model.module, torch.randn(1, 16).cuda())

step = 0
for epoch in range(args.epochs):
    for x, y in train_loader:
        loss = nn.functional.mse_loss(model(x.cuda()), y.cuda())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        writer.add_scalar("train/loss", loss.item(), step)
        step += 1
    writer.add_scalar("train/lr", optimizer.param_groups[0]["lr"], epoch)
    for name, param in model.module.named_parameters():
        writer.add_histogram(name, param, epoch)
    print(f"epoch {epoch} loss {loss.item():.4f}")
writer.close()
torch.save(model.module.state_dict(), os.path.join(run_dir, "model.pt"))
