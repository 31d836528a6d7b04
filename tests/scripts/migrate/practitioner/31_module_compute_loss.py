import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


class Classifier(nn.Module):
    def __init__(self, n_in=100, n_cls=10, smoothing=0.1):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(n_in, 256), nn.ReLU(), nn.Linear(256, n_cls))
        self.smoothing = smoothing

    def forward(self, x):
        return self.body(x)

    def compute_loss(self, x, y):
        logits = self(x)
        return nn.functional.cross_entropy(logits, y, label_smoothing=self.smoothing), logits


device = torch.device("cuda")
ds = TensorDataset(torch.randn(20000, 100), torch.randint(0, 10, (20000,)))
loader = DataLoader(ds, batch_size=500, shuffle=True, num_workers=4)
model = nn.DataParallel(Classifier()).to(device)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

for epoch in range(10):
    correct = 0
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        loss, logits = model.module.compute_loss(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        correct += (logits.argmax(1) == y).sum().item()
    print(f"epoch {epoch} loss {loss.item():.4f} train acc {correct / len(ds):.3f}")

model.eval()
with torch.no_grad():
    probe = model(torch.randn(4, 100, device=device)).softmax(1)
print("probe predictions", probe.argmax(1).tolist())
torch.save(model.module.state_dict(), "clf.pt")
