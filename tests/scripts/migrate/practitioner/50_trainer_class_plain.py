import os

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


class Trainer:
    def __init__(self, model, train_set, val_set, epochs=10, batch_size=128, lr=1e-3, out_dir="out"):
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.model = model.to(self.device)
        if torch.cuda.device_count() > 1:
            self.model = nn.DataParallel(self.model)
        self.train_loader = DataLoader(train_set, batch_size=batch_size, shuffle=True, num_workers=2)
        self.val_loader = DataLoader(val_set, batch_size=batch_size * 4)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=lr)
        self.epochs, self.out_dir = epochs, out_dir
        if not os.path.exists(out_dir):
            os.makedirs(out_dir)

    def _step(self, x, y):
        loss = nn.functional.cross_entropy(self.model(x.to(self.device)), y.to(self.device))
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return loss

    @torch.no_grad()
    def evaluate(self):
        self.model.eval()
        hits = sum((self.model(x.to(self.device)).argmax(1).cpu() == y).sum().item() for x, y in self.val_loader)
        return hits / len(self.val_loader.dataset)

    def fit(self):
        for epoch in range(self.epochs):
            self.model.train()
            for x, y in self.train_loader:
                loss = self._step(x, y)
            acc = self.evaluate()
            print(f"epoch {epoch + 1}/{self.epochs}  loss {loss.item():.4f}  val acc {acc:.4f}")
            torch.save(self.model.module.state_dict(), os.path.join(self.out_dir, f"epoch{epoch + 1}.pt"))


if __name__ == "__main__":
    net = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 3))
    train_set = TensorDataset(torch.randn(6000, 20), torch.randint(0, 3, (6000,)))
    val_set = TensorDataset(torch.randn(1500, 20), torch.randint(0, 3, (1500,)))
    Trainer(net, train_set, val_set).fit()
