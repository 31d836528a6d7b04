"""MNIST in the shape of the classic example script: options parsed inside main() (--no-cuda, --no-mps, --dry-run,
--save-model), train(args, model, device, ...) and test(model, device, ...) functions, Adadelta with a StepLR
schedule. The wrap comes first, only with more than one GPU, and the device is chosen after it; the saved state dict
is the wrapped model's (its keys start with "module.")."""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.optim.lr_scheduler import StepLR
from torchvision import datasets, transforms


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv_a = nn.Conv2d(1, 16, 3)
        self.conv_b = nn.Conv2d(16, 24, 3)
        self.drop = nn.Dropout(0.2)
        self.hidden = nn.Linear(24 * 12 * 12, 64)
        self.out = nn.Linear(64, 10)

    def forward(self, x):
        x = F.relu(self.conv_a(x))
        x = F.max_pool2d(F.relu(self.conv_b(x)), 2)
        x = self.drop(torch.flatten(x, 1))
        return F.log_softmax(self.out(F.relu(self.hidden(x))), dim=1)


def train(args, model, device, train_loader, optimizer, epoch):
    model.train()
    for batch_idx, (data, target) in enumerate(train_loader):
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        loss = F.nll_loss(model(data), target)
        loss.backward()
        optimizer.step()
        if batch_idx % args.log_interval == 0:
            done = batch_idx * len(data)
            print(f"epoch {epoch} ({done}/{len(train_loader.dataset)}) Loss: {loss.item():.6f}")
            if args.dry_run:
                break


def test(model, device, test_loader):
    model.eval()
    total, correct = 0.0, 0
    with torch.no_grad():
        for data, target in test_loader:
            data, target = data.to(device), target.to(device)
            output = model(data)
            total += F.nll_loss(output, target, reduction="sum").item()
            correct += output.argmax(dim=1).eq(target).sum().item()
    n = len(test_loader.dataset)
    print(f"  test: mean loss {total / n:.4f}, {correct} of {n} right")


def main():
    parser = argparse.ArgumentParser(description="MNIST with DataParallel")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--test-batch-size", type=int, default=1000)
    parser.add_argument("--epochs", type=int, default=14)
    parser.add_argument("--lr", type=float, default=1.0)
    parser.add_argument("--gamma", type=float, default=0.7)
    parser.add_argument("--no-cuda", action="store_true", default=False)
    parser.add_argument("--no-mps", action="store_true", default=False)
    parser.add_argument("--dry-run", action="store_true", default=False)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--log-interval", type=int, default=10)
    parser.add_argument("--save-model", action="store_true", default=False)
    args = parser.parse_args()
    use_cuda = not args.no_cuda and torch.cuda.is_available()
    use_mps = not args.no_mps and torch.backends.mps.is_available()
    torch.manual_seed(args.seed)

    train_kwargs = {"batch_size": args.batch_size}
    test_kwargs = {"batch_size": args.test_batch_size}
    if use_cuda:
        cuda_kwargs = {"num_workers": 1, "pin_memory": True, "shuffle": True}
        train_kwargs.update(cuda_kwargs)
        test_kwargs.update(cuda_kwargs)

    to_tensor = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.13,), (0.31,))])
    train_set = datasets.MNIST("data", train=True, download=False, transform=to_tensor)
    test_set = datasets.MNIST("data", train=False, download=False, transform=to_tensor)
    train_loader = torch.utils.data.DataLoader(train_set, **train_kwargs)
    test_loader = torch.utils.data.DataLoader(test_set, **test_kwargs)

    model = Classifier()
    if torch.cuda.device_count() > 1:
        model = nn.DataParallel(model)
    if use_cuda:
        device = torch.device("cuda")
    elif use_mps:
        device = torch.device("mps")
    else:
        device = torch.device("cpu")
    model.to(device)

    optimizer = optim.Adadelta(model.parameters(), lr=args.lr)
    scheduler = StepLR(optimizer, step_size=1, gamma=args.gamma)
    for epoch in range(1, args.epochs + 1):
        train(args, model, device, train_loader, optimizer, epoch)
        test(model, device, test_loader)
        scheduler.step()

    if args.save_model:
        torch.save(model.state_dict(), "mnist_cnn.pt")


if __name__ == "__main__":
    main()
