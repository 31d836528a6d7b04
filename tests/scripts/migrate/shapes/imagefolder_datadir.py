"""Dogs against cats from an ImageFolder tree under $DATADIR, in the shape of a computing centre's multi-GPU
example: it stops if DATADIR is unset, picks the device when the module is imported, wraps with more than one GPU
and divides the batch by their number, has train() and test() functions that return a dict of metrics, validates
every epoch and tests once at the end, and saves nothing. A version check at import, and an optional TensorBoard
writer."""
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from packaging.version import Version
from torchvision import datasets, transforms

if torch.cuda.is_available():
    device = torch.device("cuda")
else:
    device = torch.device("cpu")
print("torch", torch.__version__, "on", device)
assert Version(torch.__version__) >= Version("1.0")


class PetNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.fc = nn.Linear(16 * 16 * 16, 1)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return torch.sigmoid(self.fc(torch.flatten(x, 1))).squeeze(1)


def correct(output, target):
    return ((output > 0.5).long() == target).sum().item()


def train(data_loader, model, criterion, optimizer):
    model.train()
    total_loss, total_right = 0.0, 0
    for data, target in data_loader:
        data, target = data.to(device), target.to(device)
        output = model(data)
        loss = criterion(output, target.float())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total_loss += loss.item()
        total_right += correct(output, target)
    return {"loss": total_loss / len(data_loader), "accuracy": total_right / len(data_loader.dataset)}


def test(data_loader, model, criterion):
    model.eval()
    total_loss, total_right = 0.0, 0
    with torch.no_grad():
        for data, target in data_loader:
            data, target = data.to(device), target.to(device)
            output = model(data)
            total_loss += criterion(output, target.float()).item()
            total_right += correct(output, target)
    return {"loss": total_loss / len(data_loader), "accuracy": total_right / len(data_loader.dataset)}


def main():
    try:
        import tensorboardX
        log = tensorboardX.SummaryWriter()
    except ImportError:
        log = None

    datadir = os.environ.get("DATADIR")
    if datadir is None:
        print("Please set DATADIR to the folder that holds dogs-vs-cats/")
        sys.exit(1)
    root = os.path.join(datadir, "dogs-vs-cats", "train-2000")
    pipeline = transforms.Compose([transforms.Resize((64, 64)), transforms.ToTensor()])

    num_gpus = torch.cuda.device_count()
    batch_size = 25 // num_gpus
    train_set = datasets.ImageFolder(os.path.join(root, "train"), transform=pipeline)
    val_set = datasets.ImageFolder(os.path.join(root, "validation"), transform=pipeline)
    test_set = datasets.ImageFolder(os.path.join(root, "test"), transform=pipeline)
    train_loader = torch.utils.data.DataLoader(train_set, batch_size=batch_size, shuffle=True, num_workers=4)
    val_loader = torch.utils.data.DataLoader(val_set, batch_size=batch_size, shuffle=False, num_workers=4)
    test_loader = torch.utils.data.DataLoader(test_set, batch_size=batch_size, shuffle=False, num_workers=4)

    model = PetNet()
    if num_gpus > 1:
        print("using", num_gpus, "GPUs")
        model = nn.DataParallel(model)
    model.to(device)
    criterion = nn.BCELoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    num_epochs = 50
    for epoch in range(num_epochs):
        seen = train(train_loader, model, criterion, optimizer)
        checked = test(val_loader, model, criterion)
        print(f"epoch {epoch + 1}: train loss: {seen['loss']:.4f}, accuracy {seen['accuracy']:.3f}; "
              f"validation loss {checked['loss']:.4f}, accuracy {checked['accuracy']:.3f}")
        if log is not None:
            log.add_scalar("train/loss", seen["loss"], epoch)
            log.add_scalar("validation/loss", checked["loss"], epoch)

    final = test(test_loader, model, criterion)
    print(f"test loss {final['loss']:.4f}, accuracy {final['accuracy']:.3f}")


if __name__ == "__main__":
    main()
