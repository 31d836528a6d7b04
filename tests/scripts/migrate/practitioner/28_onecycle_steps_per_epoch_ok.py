import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

EPOCHS, BATCH, MAX_LR = 8, 128, 3e-3

train_ds = TensorDataset(torch.randn(12800, 40), torch.randint(0, 7, (12800,)))
val_ds = TensorDataset(torch.randn(2000, 40), torch.randint(0, 7, (2000,)))
train_loader = DataLoader(train_ds, batch_size=BATCH, shuffle=True, num_workers=2)
val_loader = DataLoader(val_ds, batch_size=500)

model = nn.Sequential(nn.Linear(40, 256), nn.LayerNorm(256), nn.GELU(), nn.Linear(256, 7))
model = nn.DataParallel(model).cuda()
optimizer = torch.optim.AdamW(model.parameters(), lr=MAX_LR, weight_decay=0.05)
scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=MAX_LR, epochs=EPOCHS,
                                                steps_per_epoch=len(train_loader))
plateau_guard = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, patience=100)

for epoch in range(EPOCHS):
    model.train()
    for x, y in train_loader:
        loss = nn.functional.cross_entropy(model(x.cuda()), y.cuda())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
    model.eval()
    with torch.no_grad():
        val_loss = sum(nn.functional.cross_entropy(model(x.cuda()), y.cuda(), reduction="sum").item()
                       for x, y in val_loader) / len(val_ds)
    plateau_guard.step(val_loss)
    print(f"epoch {epoch}: train {loss.item():.4f} val {val_loss:.4f} lr {scheduler.get_last_lr()[0]:.2e}")

torch.save(model.module.state_dict(), "onecycle_ok.pt")
