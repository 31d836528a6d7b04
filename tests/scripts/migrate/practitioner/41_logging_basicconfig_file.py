import logging
import sys

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

logging.basicConfig(
    filename="train.log",
    filemode="w",
    level=logging.INFO,
    format="%(asctime)s %(levelname)s %(message)s",
)
log = logging.getLogger("train")
log.addHandler(logging.StreamHandler(sys.stdout))


def main():
    ds = TensorDataset(torch.randn(15000, 48), torch.randint(0, 6, (15000,)))
    dl = DataLoader(ds, batch_size=150, shuffle=True, num_workers=2)
    model = nn.Sequential(nn.Linear(48, 96), nn.ReLU(), nn.Linear(96, 6))
    if torch.cuda.device_count() > 1:
        log.info("using %d GPUs with DataParallel", torch.cuda.device_count())
        model = nn.DataParallel(model)
    model = model.to("cuda")
    opt = torch.optim.RMSprop(model.parameters(), lr=1e-3)
    for epoch in range(8):
        tot = 0.0
        for i, (x, y) in enumerate(dl):
            loss = nn.functional.cross_entropy(model(x.to("cuda")), y.to("cuda"))
            opt.zero_grad()
            loss.backward()
            opt.step()
            tot += loss.item()
            if loss.item() > 5.0:
                log.warning("loss spike %.2f at epoch %d batch %d", loss.item(), epoch, i)
        log.info("epoch %d mean loss %.4f", epoch, tot / len(dl))
    torch.save(model.state_dict(), "model.pt")
    log.info("saved model.pt")


if __name__ == "__main__":
    main()
