import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def get_args():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpu-ids", type=str, default="0,1", help="e.g. 0,1,2,3")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--bs", type=int, default=128)
    return ap.parse_args()


def main():
    args = get_args()
    gpu_ids = [int(i) for i in args.gpu_ids.split(",")]
    main_dev = torch.device(f"cuda:{gpu_ids[0]}")
    model = nn.Sequential(nn.Linear(200, 400), nn.ReLU(), nn.Linear(400, 2)).to(main_dev)
    if len(gpu_ids) > 1:
        model = nn.DataParallel(model, device_ids=gpu_ids, output_device=gpu_ids[0])
    data = TensorDataset(torch.randn(8000, 200), torch.randint(0, 2, (8000,)))
    loader = DataLoader(data, batch_size=args.bs, shuffle=True)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    buffers = {f"cuda:{i}": torch.cuda.memory_allocated(i) for i in gpu_ids}
    print("memory before training:", buffers)
    for epoch in range(args.epochs):
        for x, y in loader:
            x, y = x.to(main_dev), y.to(main_dev)
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        print(f"epoch {epoch}: {loss.item():.4f}")
    torch.save(model.module.state_dict(), "fstring.pt")


if __name__ == "__main__":
    main()
