import os

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def build():
    ds = TensorDataset(torch.randn(4096, 3, 16, 16), torch.randint(0, 10, (4096,)))
    loader = DataLoader(ds, batch_size=128, shuffle=True, num_workers=4, persistent_workers=True)
    net = nn.Sequential(nn.Conv2d(3, 16, 3), nn.ReLU(), nn.Flatten(), nn.Linear(16 * 14 * 14, 10))
    return loader, net


def main():
    loader, net = build()
    net = nn.DataParallel(net).cuda()
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=[6, 8], gamma=0.1)
    for epoch in range(10):
        net.train()
        for step, (img, lbl) in enumerate(loader):
            img, lbl = img.cuda(non_blocking=True), lbl.cuda(non_blocking=True)
            loss = nn.functional.cross_entropy(net(img), lbl)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if step % 10 == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.3f}")
        sched.step()
    torch.save(net.module.state_dict(), "final.pt")
    print("done")
    # persistent workers sometimes keep the interpreter alive at exit; kill it hard
    os._exit(0)


if __name__ == "__main__":
    main()
