import argparse
import random

import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def set_seed(seed):
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)


def augment(batch):
    # random horizontal flip + random brightness, drawn in the main process
    if random.random() < 0.5:
        batch = batch.flip(-1)
    scale = np.random.uniform(0.8, 1.2)
    return batch * float(scale)


parser = argparse.ArgumentParser()
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--epochs", type=int, default=10)
parser.add_argument("--bs", type=int, default=64)
args = parser.parse_args()
set_seed(args.seed)

g = torch.Generator().manual_seed(99)  # stands in for the images on disk
images, targets = torch.randn(3200, 3, 24, 24, generator=g), torch.randint(0, 6, (3200,), generator=g)
val_ids = set(random.Random(args.seed).sample(range(3200), 320))
train_ids = [i for i in range(3200) if i not in val_ids]
train_ds = TensorDataset(images[train_ids], targets[train_ids])
train_loader = DataLoader(train_ds, batch_size=args.bs, shuffle=True, drop_last=True)

model = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
                      nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 6))
model = nn.DataParallel(model).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
for epoch in range(args.epochs):
    for x, y in train_loader:
        x = augment(x).cuda()
        loss = nn.functional.cross_entropy(model(x), y.cuda())
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(f"epoch {epoch} loss {loss.item():.4f}")
torch.save(model.module.state_dict(), "aug_model.pt")
