import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

ap = argparse.ArgumentParser()
ap.add_argument("--batch-size", type=int, default=16)
ap.add_argument("--accum", type=int, default=8, help="effective batch = batch-size x accum")
ap.add_argument("--epochs", type=int, default=3)
args = ap.parse_args()

tokens = torch.randint(0, 5000, (4000, 128))
train_loader = DataLoader(TensorDataset(tokens), batch_size=args.batch_size, shuffle=True)
model = nn.Sequential(nn.Embedding(5000, 256), nn.TransformerEncoder(
    nn.TransformerEncoderLayer(256, 4, 1024, batch_first=True), num_layers=2), nn.Linear(256, 5000))
model = nn.DataParallel(model).cuda()
optimizer = torch.optim.AdamW(model.parameters(), lr=5e-4, betas=(0.9, 0.98))

for epoch in range(args.epochs):
    model.train()
    optimizer.zero_grad()
    running = 0.0
    for i, (tok,) in enumerate(train_loader):
        tok = tok.cuda()
        logits = model(tok[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, 5000), tok[:, 1:].reshape(-1))
        (loss / args.accum).backward()
        running += loss.item()
        if (i + 1) % args.accum == 0 or (i + 1) == len(train_loader):
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad()
            print(f"epoch {epoch} update {(i + 1) // args.accum} loss {running / args.accum:.3f}")
            running = 0.0
    torch.save(model.module.state_dict(), f"lm_epoch{epoch}.pt")
