import os

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def unwrap(model):
    return model.module if isinstance(model, nn.DataParallel) else model


def save_checkpoint(model, optimizer, epoch, path):
    torch.save({"epoch": epoch, "state_dict": unwrap(model).state_dict(),
                "optimizer": optimizer.state_dict()}, path)


def load_pretrained(model, path):
    state = torch.load(path, map_location="cpu")
    unwrap(model).load_state_dict(state["state_dict"])


if __name__ == "__main__":
    out_dir = "checkpoints"
    if not os.path.exists(out_dir):
        os.makedirs(out_dir)
    model = nn.Sequential(nn.Linear(10, 50), nn.ReLU(), nn.Linear(50, 2))
    model = nn.DataParallel(model).cuda()
    if os.path.exists(os.path.join(out_dir, "pretrained.pt")):
        load_pretrained(model, os.path.join(out_dir, "pretrained.pt"))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(TensorDataset(torch.randn(5000, 10), torch.randint(0, 2, (5000,))),
                        batch_size=50, shuffle=True)
    for epoch in range(10):
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x.cuda()), y.cuda())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        save_checkpoint(model, optimizer, epoch, os.path.join(out_dir, f"epoch_{epoch}.pt"))
        print(f"epoch {epoch}: {loss.item():.4f}")
