import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Subset, TensorDataset

train_set = TensorDataset(torch.randn(40000, 50), torch.randint(0, 10, (40000,)))
val_set = TensorDataset(torch.randn(20000, 50), torch.randint(0, 10, (20000,)))
train_loader = DataLoader(train_set, batch_size=200, shuffle=True, num_workers=4)

model = nn.DataParallel(nn.Sequential(nn.Linear(50, 200), nn.ReLU(), nn.Linear(200, 10))).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, mode="min", factor=0.2, patience=1)
QUICK_VAL = 1000  # the full val set is slow: score a fresh random subset each epoch

for epoch in range(30):
    model.train()
    for x, y in train_loader:
        loss = nn.functional.cross_entropy(model(x.cuda()), y.cuda())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    pick = torch.randperm(len(val_set))[:QUICK_VAL]
    quick_loader = DataLoader(Subset(val_set, pick.tolist()), batch_size=500)
    model.eval()
    val_loss = 0.0
    with torch.no_grad():
        for x, y in quick_loader:
            val_loss += nn.functional.cross_entropy(model(x.cuda()), y.cuda(), reduction="sum").item()
    val_loss /= QUICK_VAL
    scheduler.step(val_loss)
    print(f"epoch {epoch}: train {loss.item():.4f} quick-val {val_loss:.4f} lr {optimizer.param_groups[0]['lr']:.3g}")

torch.save(model.module.state_dict(), "quickval.pt")
