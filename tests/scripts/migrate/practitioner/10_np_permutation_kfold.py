import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Subset, TensorDataset

K = 5
g = torch.Generator().manual_seed(0)  # stands in for the dataset on disk
data = TensorDataset(torch.randn(2500, 12, generator=g), torch.randint(0, 2, (2500,), generator=g))

perm = np.random.permutation(len(data))
folds = np.array_split(perm, K)
scores = []

for k in range(K):
    val_idx = folds[k]
    train_idx = np.concatenate([f for i, f in enumerate(folds) if i != k])
    train_loader = DataLoader(Subset(data, train_idx), batch_size=64, shuffle=True)
    val_loader = DataLoader(Subset(data, val_idx), batch_size=256)

    model = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 2))
    if torch.cuda.device_count() > 1:
        model = nn.DataParallel(model)
    model = model.cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)

    for epoch in range(10):
        for x, y in train_loader:
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x.cuda()), y.cuda())
            loss.backward()
            opt.step()

    correct = 0
    with torch.no_grad():
        for x, y in val_loader:
            correct += (model(x.cuda()).argmax(1).cpu() == y).sum().item()
    scores.append(correct / len(val_idx))
    print(f"fold {k}: acc {scores[-1]:.3f}")
    torch.save(model.state_dict(), f"fold{k}.pt")

print(f"CV accuracy {np.mean(scores):.3f} +- {np.std(scores):.3f}")
