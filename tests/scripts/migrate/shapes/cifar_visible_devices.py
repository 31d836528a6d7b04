# CIFAR-10 with DataParallel, in the shape of a blog post's "before" script: the GPUs are chosen in the
# environment at import time, the wrap happens only with more than one GPU, the model and the labels are moved with
# .cuda() (the images are left where the loader put them), one epoch, then the weights are saved and read back
# into the wrapped model for a test pass.
import os

os.environ["CUDA_VISIBLE_DEVICES"] = "0,1,2,3"

import torch
import torch.nn as nn
import torch.optim as optim
import torchvision
import torchvision.transforms as transforms


class SmallConvNet(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 5), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 5), nn.ReLU(), nn.MaxPool2d(2),
        )
        self.head = nn.Linear(16 * 5 * 5, classes)

    def forward(self, x):
        return self.head(torch.flatten(self.features(x), 1))


def main():
    epochs = 1
    batch_size = 1024
    normalize = transforms.Compose([
        transforms.ToTensor(),
        transforms.Normalize((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
    ])
    trainset = torchvision.datasets.CIFAR10(root="./data", train=True, download=True, transform=normalize)
    trainloader = torch.utils.data.DataLoader(trainset, batch_size=batch_size, shuffle=True, num_workers=0)
    testset = torchvision.datasets.CIFAR10(root="./data", train=False, download=True, transform=normalize)
    testloader = torch.utils.data.DataLoader(testset, batch_size=batch_size, shuffle=False, num_workers=0)

    net = SmallConvNet()
    if torch.cuda.device_count() > 1:
        print("using", torch.cuda.device_count(), "GPUs")
        net = nn.DataParallel(net)
    net.cuda()

    criterion = nn.CrossEntropyLoss()
    optimizer = optim.SGD(net.parameters(), lr=0.01, momentum=0.9)

    for epoch in range(epochs):
        running = 0.0
        for batch in trainloader:
            inputs, labels = batch[0], batch[1].cuda()
            optimizer.zero_grad()
            loss = criterion(net(inputs), labels)
            loss.backward()
            optimizer.step()
            running += loss.item()
        print(f"[{epoch + 1}] loss: {running / len(trainloader):.3f}")

    path = "./cifar_net.pth"
    torch.save(net.state_dict(), path)

    net.load_state_dict(torch.load(path))
    correct = total = 0
    with torch.no_grad():
        for images, labels in testloader:
            labels = labels.cuda()
            predicted = net(images).argmax(dim=1)
            total += labels.size(0)
            correct += (predicted == labels).sum().item()
    print(f"accuracy on the {total} test images: {100 * correct // total} %")


if __name__ == "__main__":
    main()
