import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset


class VarLenDataset(Dataset):
    """Sequences of very different lengths: a long batch can run out of memory."""

    def __init__(self, n=3000):
        self.lengths = torch.randint(16, 2048, (n,)).tolist()

    def __len__(self):
        return len(self.lengths)

    def __getitem__(self, i):
        return torch.randn(self.lengths[i], 32), torch.randint(0, 4, ()).item()


def collate(batch):
    xs, ys = zip(*batch)
    return nn.utils.rnn.pad_sequence(xs, batch_first=True), torch.tensor(ys)


model = nn.DataParallel(nn.GRU(32, 128, batch_first=True)).cuda()
head = nn.Linear(128, 4).cuda()
opt = torch.optim.Adam(list(model.parameters()) + list(head.parameters()), lr=1e-3)
loader = DataLoader(VarLenDataset(), batch_size=32, shuffle=True, collate_fn=collate)
skipped = 0
for epoch in range(5):
    for x, y in loader:
        try:
            out, _ = model(x.cuda())
            loss = nn.functional.cross_entropy(head(out[:, -1]), y.cuda())
            opt.zero_grad()
            loss.backward()
            opt.step()
        except RuntimeError as e:
            if "out of memory" in str(e):
                skipped += 1
                print(f"OOM on a batch of shape {tuple(x.shape)}, skipping ({skipped} so far)")
                opt.zero_grad()
                torch.cuda.empty_cache()
                continue
            raise
    print(f"epoch {epoch}: loss {loss.item():.4f}, {skipped} batches skipped")
torch.save({"gru": model.module.state_dict(), "head": head.state_dict()}, "gru.pt")
