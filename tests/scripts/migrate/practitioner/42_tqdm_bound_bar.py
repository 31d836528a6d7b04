import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
from tqdm import tqdm

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
train_ds = TensorDataset(torch.randn(20000, 32), torch.randint(0, 4, (20000,)))
val_ds = TensorDataset(torch.randn(2000, 32), torch.randint(0, 4, (2000,)))
train_loader = DataLoader(train_ds, batch_size=64, shuffle=True, num_workers=4)
val_loader = DataLoader(val_ds, batch_size=256)

model = nn.DataParallel(nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 4))).to(device)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
criterion = nn.CrossEntropyLoss()

for epoch in range(10):
    model.train()
    pbar = tqdm(train_loader, desc=f"epoch {epoch}", dynamic_ncols=True)
    for x, y in pbar:
        x, y = x.to(device), y.to(device)
        loss = criterion(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        pbar.set_postfix(loss=f"{loss.item():.4f}", lr=optimizer.param_groups[0]["lr"])
    pbar.close()

    model.eval()
    correct = 0
    with torch.no_grad():
        for x, y in tqdm(val_loader, desc="val", leave=False):
            correct += (model(x.to(device)).argmax(1) == y.to(device)).sum().item()
    tqdm.write(f"epoch {epoch}: val acc {correct / len(val_ds):.4f}")

torch.save(model.module.state_dict(), "tqdm_model.pt")
