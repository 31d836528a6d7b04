"""A DataParallel script with mixed precision and gradient accumulation (issue 54), ours: autocast, a GradScaler
(enabled where CUDA is), the optimizer stepping every --accum batches through the scaler."""
import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--accum", type=int, default=4)
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(512, 16, generator=g)
    y = x[:, :4].sum(1, keepdim=True) * 0.5
    loader = DataLoader(TensorDataset(x, y), batch_size=args.batch_size, shuffle=True)
    model = nn.DataParallel(nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scaler = torch.amp.GradScaler(device.type, enabled=device.type == "cuda")
    half = torch.float16 if device.type == "cuda" else torch.bfloat16
    for epoch in range(args.epochs):
        running = 0.0
        for i, (xb, yb) in enumerate(loader):
            xb, yb = xb.to(device), yb.to(device)
            with torch.autocast(device_type=device.type, dtype=half):
                loss = nn.functional.mse_loss(model(xb).float(), yb) / args.accum
            scaler.scale(loss).backward()
            if (i + 1) % args.accum == 0:
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad()
            running += loss.item() * args.accum
        print(f"epoch {epoch} loss {running / len(loader):.4f}")
    torch.save(model.module.state_dict(), "amp_model.pt")


if __name__ == "__main__":
    main()
