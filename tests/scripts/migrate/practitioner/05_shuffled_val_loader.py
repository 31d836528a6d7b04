import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

torch.backends.cudnn.benchmark = True

X = torch.randn(6000, 1, 28, 28)
y = torch.randint(0, 10, (6000,))
train_set = TensorDataset(X[:5000], y[:5000])
val_set = TensorDataset(X[5000:], y[5000:])
train_loader = DataLoader(train_set, batch_size=100, shuffle=True)
val_loader = DataLoader(val_set, batch_size=100, shuffle=True)  # copied from the train line

net = nn.Sequential(
    nn.Conv2d(1, 32, 3), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
    nn.Flatten(), nn.Linear(32 * 13 * 13, 10),
)
if torch.cuda.device_count() > 1:
    print("Let's use", torch.cuda.device_count(), "GPUs!")
    net = nn.DataParallel(net)
net.cuda()
opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9, nesterov=True)
loss_fn = nn.CrossEntropyLoss()

best_acc, patience, bad = 0.0, 3, 0
for epoch in range(50):
    net.train()
    for xb, yb in train_loader:
        xb, yb = xb.cuda(non_blocking=True), yb.cuda(non_blocking=True)
        opt.zero_grad()
        loss_fn(net(xb), yb).backward()
        opt.step()
    net.eval()
    correct = 0
    with torch.no_grad():
        for xb, yb in val_loader:
            correct += (net(xb.cuda()).argmax(dim=1) == yb.cuda()).sum().item()
    acc = correct / len(val_set)
    print(f"epoch {epoch} val acc {acc:.4f}")
    if acc > best_acc:
        best_acc, bad = acc, 0
        torch.save(net.state_dict(), "best.pth")
    else:
        bad += 1
        if bad >= patience:
            print("early stop")
            break
