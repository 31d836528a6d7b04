"""CIFAR-10 in the shape of a platform's single-node multi-GPU sample: .cuda() everywhere, a builder that wraps only
when --gpuid lists more than one id and sets a flag on args that the loops read, CUDA_VISIBLE_DEVICES set from the
options after parsing, a CPU path (--cpu), SGD with MultiStepLR, and the best weights kept in memory (the inner
model's when wrapped), never written to disk."""
import argparse
import copy
import os
import re

import torch
import torch.nn as nn
import torch.nn.functional as F
from torchvision import datasets, transforms


class TinyNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 12, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.fc1 = nn.Linear(12 * 14 * 14, 48)
        self.fc2 = nn.Linear(48, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.conv(x)))
        return self.fc2(F.relu(self.fc1(x.view(x.size(0), -1))))


def build_net(args):
    net = TinyNet()
    if args.cpu:
        args.gpu = False
        return net
    gpus = re.split(",", args.gpuid)
    if len(gpus) > 1:
        net = nn.DataParallel(net)
    net.cuda()
    args.gpu = True
    return net


def loaders(args):
    pipeline = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.5,) * 3, (0.25,) * 3)])
    train_set = datasets.CIFAR10(root=args.data, train=True, download=True, transform=pipeline)
    val_set = datasets.CIFAR10(root=args.data, train=False, download=True, transform=pipeline)
    train_loader = torch.utils.data.DataLoader(train_set, batch_size=args.batchsize, shuffle=True)
    val_loader = torch.utils.data.DataLoader(val_set, batch_size=args.batchsize, shuffle=False)
    return train_loader, val_loader


def train_epoch(args, net, loader, optimizer, epoch):
    net.train()
    total = 0.0
    for data, target in loader:
        if args.gpu:
            data, target = data.cuda(), target.cuda()
        optimizer.zero_grad()
        loss = F.cross_entropy(net(data), target)
        loss.backward()
        optimizer.step()
        total += loss.item()
    print("Epoch: %d , Loss: %.4f , lr: %g" % (epoch, total / len(loader), optimizer.param_groups[0]["lr"]))


def validate(args, net, loader):
    net.eval()
    right = 0
    with torch.no_grad():
        for data, target in loader:
            if args.gpu:
                data, target = data.cuda(), target.cuda()
            right += (net(data).argmax(1) == target).sum().item()
    return right / len(loader.dataset)


def main(args):
    train_loader, val_loader = loaders(args)
    net = build_net(args)
    optimizer = torch.optim.SGD(net.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)
    scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=[50, 75], gamma=0.1)
    best, best_weights = 0.0, None
    for epoch in range(args.epoch):
        train_epoch(args, net, train_loader, optimizer, epoch)
        scheduler.step()
        accuracy = validate(args, net, val_loader)
        if accuracy > best:
            best = accuracy
            if isinstance(net, nn.DataParallel):
                best_weights = copy.deepcopy(net.module.state_dict())
            else:
                best_weights = copy.deepcopy(net.state_dict())
    print("best validation accuracy: %.3f (%s)" % (best, "kept" if best_weights else "none"))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpuid", default="0,1", help="comma-separated GPU ids")
    parser.add_argument("--cpu", action="store_true", help="train on the CPU")
    parser.add_argument("--data", default="data")
    parser.add_argument("--batchsize", type=int, default=128)
    parser.add_argument("--epoch", type=int, default=2)
    parser.add_argument("--lr", type=float, default=0.01)
    args = parser.parse_args()
    os.environ["CUDA_VISIBLE_DEVICES"] = args.gpuid
    main(args)
