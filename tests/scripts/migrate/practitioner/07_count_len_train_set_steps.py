from types import SimpleNamespace

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

cfg = SimpleNamespace(
    epochs=4, batch_size=32, lr=1e-3, log_every=50, ckpt="last.pt",
    data=SimpleNamespace(n_train=8192, n_features=64),
)


def main(cfg):
    train_set = TensorDataset(torch.randn(cfg.data.n_train, cfg.data.n_features),
                              torch.randn(cfg.data.n_train, 1))
    train_loader = DataLoader(train_set, batch_size=cfg.batch_size, shuffle=True,
                              num_workers=2, drop_last=True)
    model = nn.Sequential(nn.Linear(cfg.data.n_features, 256), nn.SiLU(), nn.Linear(256, 1))
    model = nn.DataParallel(model).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    total_steps = cfg.epochs * (len(train_set) // cfg.batch_size)
    global_step, epoch = 0, 0
    while global_step < total_steps:
        running, seen = 0.0, 0
        for x, y in train_loader:
            x, y = x.cuda(), y.cuda()
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            global_step += 1
            running += loss.item() * x.size(0)
            seen += x.size(0)
            if global_step % cfg.log_every == 0:
                print(f"step {global_step}/{total_steps} loss {loss.item():.4f}")
            if global_step >= total_steps:
                break
        epoch += 1
        print(f"epoch {epoch}: mean loss {running / len(train_set):.4f} over {seen} samples")
    torch.save({"model": model.module.state_dict(), "step": global_step}, cfg.ckpt)


if __name__ == "__main__":
    main(cfg)
