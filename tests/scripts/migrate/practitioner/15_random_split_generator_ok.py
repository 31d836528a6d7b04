import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset, random_split


def make_dataset(n=6000):
    g = torch.Generator().manual_seed(3)  # stands in for the CSV on disk
    x = torch.randn(n, 8, generator=g)
    w = torch.arange(1.0, 9.0)
    return TensorDataset(x, (x @ w).unsqueeze(1) + 0.1 * torch.randn(n, 1, generator=g))


def main():
    full = make_dataset()
    n_val = len(full) // 10
    train_set, val_set = random_split(full, [len(full) - n_val, n_val],
                                      generator=torch.Generator().manual_seed(42))
    train_loader = DataLoader(train_set, batch_size=128, shuffle=True, num_workers=2)
    val_loader = DataLoader(val_set, batch_size=512)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = nn.Linear(8, 1)
    model = nn.DataParallel(model)
    model.to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
    sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.5, patience=2)
    for epoch in range(25):
        model.train()
        for x, y in train_loader:
            loss = nn.functional.mse_loss(model(x.to(device)), y.to(device))
            opt.zero_grad()
            loss.backward()
            opt.step()
        model.eval()
        with torch.no_grad():
            val_loss = sum(nn.functional.mse_loss(model(x.to(device)), y.to(device), reduction="sum").item()
                           for x, y in val_loader) / n_val
        sched.step(val_loss)
        print(f"epoch {epoch}: val mse {val_loss:.4f} lr {opt.param_groups[0]['lr']:.2e}")
    torch.save(model.module.state_dict(), "linreg.pt")


if __name__ == "__main__":
    main()
