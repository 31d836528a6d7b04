import argparse
import sys

import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def train_test_split(X, y, test_size=0.2, random_state=None):
    """Same contract as sklearn.model_selection.train_test_split for two arrays."""
    rng = np.random.RandomState(random_state)
    idx = rng.permutation(len(X))
    n_test = int(round(len(X) * test_size))
    return X[idx[n_test:]], X[idx[:n_test]], y[idx[n_test:]], y[idx[:n_test]]


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=None, help="split seed (default: a new split each run)")
    ap.add_argument("--epochs", type=int, default=15)
    args = ap.parse_args(argv)

    X = np.random.RandomState(0).randn(5000, 30).astype(np.float32)  # stands in for features.npy
    y = (X[:, 0] + X[:, 1] > 0).astype(np.int64)
    X_tr, X_te, y_tr, y_te = train_test_split(X, y, test_size=0.25, random_state=args.seed)
    train_loader = DataLoader(TensorDataset(torch.from_numpy(X_tr), torch.from_numpy(y_tr)),
                              batch_size=100, shuffle=True)
    X_te, y_te = torch.from_numpy(X_te).cuda(), torch.from_numpy(y_te).cuda()

    model = nn.DataParallel(nn.Sequential(nn.Linear(30, 16), nn.ReLU(), nn.Linear(16, 2))).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for epoch in range(args.epochs):
        for xb, yb in train_loader:
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(xb.cuda()), yb.cuda())
            loss.backward()
            opt.step()
        with torch.no_grad():
            acc = (model(X_te).argmax(1) == y_te).float().mean().item()
        print(f"epoch {epoch}: loss {loss.item():.3f} holdout acc {acc:.3f}")
    torch.save(model.state_dict(), "clf.pt")
    return 0


if __name__ == "__main__":
    sys.exit(main())
