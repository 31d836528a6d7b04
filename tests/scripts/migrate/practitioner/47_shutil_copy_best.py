import os
import shutil

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def save_checkpoint(state, is_best, outdir="ckpt", filename="checkpoint.pth.tar"):
    path = os.path.join(outdir, filename)
    torch.save(state, path)
    if is_best:
        shutil.copyfile(path, os.path.join(outdir, "model_best.pth.tar"))


def validate(model, loader):
    model.eval()
    correct = 0
    with torch.no_grad():
        for x, y in loader:
            correct += (model(x.cuda()).argmax(1) == y.cuda()).sum().item()
    return 100.0 * correct / len(loader.dataset)


def main():
    os.makedirs("ckpt", exist_ok=True)
    train_loader = DataLoader(TensorDataset(torch.randn(10000, 30), torch.randint(0, 5, (10000,))),
                              batch_size=100, shuffle=True, num_workers=4, pin_memory=True)
    val_loader = DataLoader(TensorDataset(torch.randn(2000, 30), torch.randint(0, 5, (2000,))),
                            batch_size=500, num_workers=4)
    model = nn.DataParallel(nn.Sequential(nn.Linear(30, 100), nn.ReLU(), nn.Linear(100, 5))).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    best_acc1 = 0.0
    for epoch in range(30):
        model.train()
        for x, y in train_loader:
            loss = nn.functional.cross_entropy(model(x.cuda(non_blocking=True)), y.cuda(non_blocking=True))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        acc1 = validate(model, val_loader)
        is_best = acc1 > best_acc1
        best_acc1 = max(acc1, best_acc1)
        print(f"epoch {epoch}: acc@1 {acc1:.2f} (best {best_acc1:.2f})")
        save_checkpoint({"epoch": epoch + 1, "state_dict": model.state_dict(), "best_acc1": best_acc1,
                         "optimizer": optimizer.state_dict()}, is_best)


if __name__ == "__main__":
    main()
