import logging

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

CFG = {
    "trainer": {"max_epochs": 6, "device": "cuda"},
    "data": {"n": 12000, "dim": 24, "batch_size": 96, "workers": 2},
    "optim": {"lr": 2e-3, "weight_decay": 1e-2},
    "ckpt_path": "model_final.pt",
}


def build_model(cfg):
    d = cfg["data"]["dim"]
    return nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Dropout(0.1), nn.Linear(4 * d, 1))


def main(cfg):
    dcfg = cfg["data"]
    ds = TensorDataset(torch.randn(dcfg["n"], dcfg["dim"]), torch.randn(dcfg["n"], 1))
    train_loader = DataLoader(ds, batch_size=dcfg["batch_size"], shuffle=True, num_workers=dcfg["workers"])
    model = nn.DataParallel(build_model(cfg)).to(cfg["trainer"]["device"])
    optimizer = torch.optim.AdamW(model.parameters(), **cfg["optim"])
    for epoch in range(cfg["trainer"]["max_epochs"]):
        model.train()
        for x, y in train_loader:
            x, y = x.to(cfg["trainer"]["device"]), y.to(cfg["trainer"]["device"])
            loss = nn.functional.huber_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch}: loss {loss.item():.4f}")
    torch.save(model.module.state_dict(), cfg["ckpt_path"])
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    main(CFG)
