import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def main():
    device = torch.device("cuda")
    train_loader = DataLoader(TensorDataset(torch.randn(16384, 256), torch.randint(0, 50, (16384,))),
                              batch_size=256, shuffle=True, num_workers=4, pin_memory=True, drop_last=True)
    model = nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 1024), nn.GELU(), nn.Linear(1024, 50))
    model = nn.DataParallel(model).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=20)
    scaler = torch.cuda.amp.GradScaler()

    for epoch in range(20):
        model.train()
        for x, y in train_loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(device_type="cuda", dtype=torch.float16):
                loss = nn.functional.cross_entropy(model(x), y)
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
            scaler.step(optimizer)
            scaler.update()
        scheduler.step()
        print(f"epoch {epoch} loss {loss.item():.4f} scale {scaler.get_scale():.0f}")

    torch.save({"model": model.module.state_dict(), "scaler": scaler.state_dict()}, "amp.pt")


if __name__ == "__main__":
    main()
