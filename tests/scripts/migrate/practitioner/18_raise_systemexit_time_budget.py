import argparse
import time

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


class Trainer:
    def __init__(self, args):
        self.args = args
        self.device = torch.device("cuda")
        data = TensorDataset(torch.randn(50000, 128), torch.randint(0, 20, (50000,)))
        self.loader = DataLoader(data, batch_size=args.batch_size, shuffle=True, num_workers=4)
        net = nn.Sequential(nn.Linear(128, 512), nn.ReLU(), nn.Linear(512, 20))
        self.model = nn.DataParallel(net).to(self.device)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1, momentum=0.9)
        self.start = time.time()

    def checkpoint(self, tag):
        torch.save({"model": self.model.module.state_dict(), "opt": self.opt.state_dict()}, f"ckpt_{tag}.pt")

    def train(self):
        budget = self.args.hours * 3600
        for epoch in range(self.args.epochs):
            for i, (x, y) in enumerate(self.loader):
                out = self.model(x.to(self.device))
                loss = nn.functional.cross_entropy(out, y.to(self.device))
                self.opt.zero_grad()
                loss.backward()
                self.opt.step()
                if time.time() - self.start > budget:
                    print(f"time budget of {self.args.hours}h used up at epoch {epoch} batch {i}")
                    self.checkpoint("budget")
                    raise SystemExit(0)
            self.checkpoint(f"epoch{epoch}")
            print(f"epoch {epoch} done, loss {loss.item():.4f}")


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=90)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--hours", type=float, default=2.0)
    Trainer(p.parse_args()).train()
