import csv
import json
import time

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

config = {"lr": 3e-4, "epochs": 15, "batch_size": 64, "hidden": 128}
with open("config.json", "w") as f:
    json.dump(config, f, indent=2)

train_loader = DataLoader(TensorDataset(torch.randn(9600, 20), torch.randn(9600, 1)),
                          batch_size=config["batch_size"], shuffle=True)
model = nn.Sequential(nn.Linear(20, config["hidden"]), nn.ReLU(), nn.Linear(config["hidden"], 1))
model = nn.DataParallel(model).cuda()
opt = torch.optim.Adam(model.parameters(), lr=config["lr"])

log_file = open("metrics.csv", "w", newline="")
csv_writer = csv.writer(log_file)
csv_writer.writerow(["epoch", "loss", "seconds"])
for epoch in range(config["epochs"]):
    t0, total, n = time.time(), 0.0, 0
    for x, y in train_loader:
        loss = nn.functional.l1_loss(model(x.cuda()), y.cuda())
        opt.zero_grad()
        loss.backward()
        opt.step()
        total, n = total + loss.item(), n + 1
    csv_writer.writerow([epoch, total / n, round(time.time() - t0, 2)])
    log_file.flush()
    print(f"epoch {epoch}: {total / n:.4f}")
log_file.close()
torch.save(model.module.state_dict(), "l1_model.pt")
