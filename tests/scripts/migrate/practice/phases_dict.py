"""Loaders in a dict by phase, the finetuning tutorials' shape: one loop over dataloaders[phase], the backward
under if phase == "train"; the accuracy divided by the set's size (issue 75)."""
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
train_set = TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,)))
val_set = TensorDataset(torch.randn(32, 4), torch.randint(0, 2, (32,)))


def train_model(model, dataloaders, dataset_sizes, criterion, optimizer, num_epochs=3):
    for _ in range(num_epochs):
        for phase in ["train", "val"]:
            if phase == "train":
                model.train()
            else:
                model.eval()
            running_loss, running_corrects = 0.0, 0
            for inputs, labels in dataloaders[phase]:
                optimizer.zero_grad()
                with torch.set_grad_enabled(phase == "train"):
                    outputs = model(inputs)
                    loss = criterion(outputs, labels)
                    if phase == "train":
                        loss.backward()
                        optimizer.step()
                running_loss += loss.item() * inputs.size(0)
                running_corrects += (outputs.argmax(1) == labels).sum()
            epoch_acc = running_corrects.double() / dataset_sizes[phase]
            print(phase, "acc", epoch_acc)


def main():
    sets = {"train": train_set, "val": val_set}
    loaders = {"train": DataLoader(train_set, batch_size=8, shuffle=True),
               "val": DataLoader(val_set, batch_size=8, shuffle=True)}
    sizes = {x: len(sets[x]) for x in ["train", "val"]}
    model = nn.DataParallel(nn.Linear(4, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    train_model(model, loaders, sizes, nn.CrossEntropyLoss(), opt)


if __name__ == "__main__":
    main()
