"""Fine-tune an ImageNet ResNet-18 on MNIST, in the shape of a cluster tutorial's DataParallel step: argparse under
the main guard, main(args), a device string, the model moved to the device and then wrapped whatever the number of
GPUs, a summed loss, a training loop only (running loss and accuracy, timed), nothing saved."""
import argparse
import time

import torch
import torchvision
from torchvision import transforms


def build_model():
    model = torchvision.models.resnet18(pretrained=True)
    # MNIST is one channel and ten classes
    model.conv1 = torch.nn.Conv2d(1, 64, kernel_size=7, stride=2, padding=3, bias=False)
    model.fc = torch.nn.Linear(model.fc.in_features, 10)
    return model


def main(args):
    device = "cuda:0" if torch.cuda.is_available() else "cpu"
    dataset = torchvision.datasets.MNIST(root=args.data, train=True, download=True,
                                         transform=transforms.ToTensor())
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, shuffle=True,
                                         num_workers=args.num_workers)
    model = build_model()
    model.to(device)
    model = torch.nn.DataParallel(model)
    criterion = torch.nn.CrossEntropyLoss(reduction="sum")
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)

    for epoch in range(args.max_epochs):
        started = time.time()
        seen, total_loss, right = 0, 0.0, 0
        model.train()
        for images, targets in loader:
            images, targets = images.to(device), targets.to(device)
            optimizer.zero_grad()
            outputs = model(images)
            loss = criterion(outputs, targets)
            loss.backward()
            optimizer.step()
            seen += targets.size(0)
            total_loss += loss.item()
            right += (outputs.argmax(1) == targets).sum().item()
        print(f"epoch {epoch + 1}/{args.max_epochs} | Loss: {total_loss / seen:.4f} | "
              f"Acc: {right / seen:.4f} | {time.time() - started:.1f} s")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="ResNet-18 on MNIST with DataParallel")
    parser.add_argument("--data", default="./data")
    parser.add_argument("--batch_size", type=int, default=128)
    parser.add_argument("--max_epochs", type=int, default=2)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--num_workers", type=int, default=0)
    main(parser.parse_args())
