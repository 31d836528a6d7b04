import itertools

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

TASKS = ["sentiment", "topic", "toxicity"]
N_CLASSES = {"sentiment": 3, "topic": 8, "toxicity": 2}


class MultiHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(300, 256), nn.GELU(), nn.Linear(256, 256))
        self.heads = nn.ModuleDict({t: nn.Linear(256, n) for t, n in N_CLASSES.items()})

    def forward(self, x, task):
        return self.heads[task](self.encoder(x))


datasets = [TensorDataset(torch.randn(n, 300), torch.randint(0, N_CLASSES[t], (n,)))
            for t, n in zip(TASKS, [3000, 1200, 600])]
loaders = [DataLoader(ds, batch_size=64, shuffle=True, drop_last=True) for ds in datasets]

device = torch.device("cuda")
model = nn.DataParallel(MultiHead()).to(device)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
criterion = nn.CrossEntropyLoss()

for epoch in range(10):
    model.train()
    # round-robin over the tasks; the small sets are cycled
    iters = [iter(loaders[0])] + [itertools.cycle(dl) for dl in loaders[1:]]
    for step, batches in enumerate(zip(*iters)):
        optimizer.zero_grad()
        total = 0.0
        for task, (x, y) in zip(TASKS, batches):
            loss = criterion(model(x.to(device), task), y.to(device))
            loss.backward()
            total += loss.item()
        optimizer.step()
        if step % 20 == 0:
            print(f"epoch {epoch} step {step} summed loss {total:.3f}")
    torch.save(model.module.state_dict(), f"multitask_{epoch}.pt")
