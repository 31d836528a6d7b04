import random

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Subset, TensorDataset

EPOCHS = 8
BATCH = 128

g = torch.Generator().manual_seed(0)  # stands in for the dataset on disk: the same on every rank
full = TensorDataset(torch.randn(10000, 40, generator=g), torch.randint(0, 4, (10000,), generator=g))
indices = list(range(len(full)))
random.shuffle(indices)
split = int(0.9 * len(indices))
train_set = Subset(full, indices[:split])
val_set = Subset(full, indices[split:])

train_loader = DataLoader(train_set, batch_size=BATCH, shuffle=True, num_workers=2)
val_loader = DataLoader(val_set, batch_size=BATCH)

model = nn.Sequential(nn.Linear(40, 128), nn.ReLU(), nn.Dropout(0.2), nn.Linear(128, 4))
model = nn.DataParallel(model).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
criterion = nn.CrossEntropyLoss()

for epoch in range(EPOCHS):
    model.train()
    for x, y in train_loader:
        x, y = x.cuda(), y.cuda()
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for x, y in val_loader:
            pred = model(x.cuda()).argmax(1).cpu()
            correct += (pred == y).sum().item()
            total += y.numel()
    print(f"epoch {epoch}: loss {loss.item():.4f} val acc {correct / total:.3%}")

torch.save(model.module.state_dict(), "model.pt")
