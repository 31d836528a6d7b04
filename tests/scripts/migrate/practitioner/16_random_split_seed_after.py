import os

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset, random_split


def get_data():
    g = torch.Generator().manual_seed(5)  # stands in for torch.load("data.pt")
    x = torch.randn(7000, 10, generator=g)
    return TensorDataset(x, (x.sum(1, keepdim=True) > 0).float())


dataset = get_data()
train_set, val_set, test_set = random_split(dataset, [5000, 1000, 1000])
torch.manual_seed(0)  # reproducible init and shuffling

BATCH = int(os.environ.get("BATCH", 256))
train_loader = DataLoader(train_set, batch_size=BATCH, shuffle=True)
val_loader = DataLoader(val_set, batch_size=BATCH)
test_loader = DataLoader(test_set, batch_size=BATCH)

model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 1))
model = nn.DataParallel(model).to("cuda:0")
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
crit = nn.BCEWithLogitsLoss()


def accuracy(loader):
    model.eval()
    hits = 0
    with torch.no_grad():
        for x, y in loader:
            hits += ((model(x.to("cuda:0")) > 0).float() == y.to("cuda:0")).sum().item()
    return hits / len(loader.dataset)


for epoch in range(12):
    model.train()
    for x, y in train_loader:
        x, y = x.to("cuda:0"), y.to("cuda:0")
        loss = crit(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(f"epoch {epoch}: loss {loss.item():.4f} val acc {accuracy(val_loader):.4f}")

print(f"test acc {accuracy(test_loader):.4f}")
torch.save(model.module.state_dict(), "clf.pt")
