import functools
import logging

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

log = logging.getLogger(__name__)

make_loader = functools.partial(DataLoader, num_workers=2, pin_memory=True, persistent_workers=True)


class Trainer:
    def __init__(self, model, train_ds, val_ds, lr=1e-3, batch_size=64):
        self.device = torch.device("cuda:0")
        self.model = nn.DataParallel(model).to(self.device)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=lr)
        self.train_loader = make_loader(train_ds, batch_size=batch_size, shuffle=True)
        self.val_loader = make_loader(val_ds, batch_size=batch_size)
        self.loss_fn = nn.BCEWithLogitsLoss()

    def train_epoch(self):
        self.model.train()
        for x, y in self.train_loader:
            x, y = x.to(self.device), y.to(self.device)
            loss = self.loss_fn(self.model(x).squeeze(1), y)
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
        return loss.item()

    @torch.no_grad()
    def validate(self):
        self.model.eval()
        losses = [self.loss_fn(self.model(x.to(self.device)).squeeze(1), y.to(self.device)).item()
                  for x, y in self.val_loader]
        return sum(losses) / len(losses)

    def fit(self, epochs):
        for epoch in range(epochs):
            last = self.train_epoch()
            val = self.validate()
            log.info("epoch %d last-batch loss %.4f val %.4f", epoch, last, val)
        torch.save(self.model.module.state_dict(), "trainer_final.pt")


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    train_ds = TensorDataset(torch.randn(5000, 16), torch.randint(0, 2, (5000,)).float())
    val_ds = TensorDataset(torch.randn(1000, 16), torch.randint(0, 2, (1000,)).float())
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
    Trainer(model, train_ds, val_ds).fit(epochs=5)
