import torch
import torch.nn as nn
from torch.optim.lr_scheduler import ReduceLROnPlateau
from torch.utils.data import DataLoader, TensorDataset


class AutoEncoder(nn.Module):
    def __init__(self, d=784, z=32):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(d, 256), nn.ReLU(), nn.Linear(256, z))
        self.dec = nn.Sequential(nn.Linear(z, 256), nn.ReLU(), nn.Linear(256, d), nn.Sigmoid())

    def forward(self, x):
        return self.dec(self.enc(x))


def main():
    data = TensorDataset(torch.rand(12000, 784))
    loader = DataLoader(data, batch_size=256, shuffle=True, num_workers=2)
    device = "cuda"
    model = nn.DataParallel(AutoEncoder()).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    scheduler = ReduceLROnPlateau(optimizer, mode="min", factor=0.3, patience=1, threshold=1e-3)
    for epoch in range(40):
        model.train()
        epoch_loss = 0.0
        for (x,) in loader:
            x = x.to(device)
            loss = nn.functional.binary_cross_entropy(model(x), x)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            epoch_loss += loss.item()
        epoch_loss /= len(loader)
        scheduler.step(epoch_loss)  # no validation set: plateau on the training loss
        lr = optimizer.param_groups[0]["lr"]
        print(f"epoch {epoch:02d} recon {epoch_loss:.5f} lr {lr:.1e}")
    torch.save(model.module.state_dict(), "ae.pt")


if __name__ == "__main__":
    main()
