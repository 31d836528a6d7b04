import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--ngpu", type=int, default=torch.cuda.device_count())
parser.add_argument("--epochs", type=int, default=10)
opt = parser.parse_args()
device = torch.device("cuda:0" if torch.cuda.is_available() and opt.ngpu > 0 else "cpu")


class Encoder(nn.Module):
    def __init__(self, ngpu):
        super().__init__()
        self.ngpu = ngpu
        self.main = nn.Sequential(
            nn.Conv2d(1, 32, 4, 2, 1), nn.LeakyReLU(0.2), nn.Conv2d(32, 64, 4, 2, 1),
            nn.BatchNorm2d(64), nn.LeakyReLU(0.2), nn.Flatten(), nn.Linear(64 * 7 * 7, 10),
        )

    def forward(self, x):
        if x.is_cuda and self.ngpu > 1:
            return nn.parallel.data_parallel(self.main, x, range(self.ngpu))
        return self.main(x)


net = Encoder(opt.ngpu).to(device)
loader = DataLoader(TensorDataset(torch.randn(6400, 1, 28, 28), torch.randint(0, 10, (6400,))),
                    batch_size=128, shuffle=True, num_workers=2)
optimizer = torch.optim.Adam(net.parameters(), lr=2e-4, betas=(0.5, 0.999))
for epoch in range(opt.epochs):
    for i, (img, lbl) in enumerate(loader):
        img, lbl = img.to(device), lbl.to(device)
        loss = nn.functional.cross_entropy(net(img), lbl)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if i % 10 == 0:
            print("[%d/%d][%d/%d] loss: %.4f" % (epoch, opt.epochs, i, len(loader), loss.item()))
torch.save(net.state_dict(), "encoder.pt")
