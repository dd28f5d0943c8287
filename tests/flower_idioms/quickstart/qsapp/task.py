"""qsapp: the model, the data and the loops, in the shapes Flower's quickstart-pytorch writes them."""

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset
from torchvision.transforms import Compose, Normalize, ToTensor


class Net(nn.Module):
    """LeNet-style CNN; ``view`` flattens, as the quickstart does."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = x.view(-1, 16 * 5 * 5)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


pytorch_transforms = Compose([ToTensor(), Normalize((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))])


class Pictures(Dataset):
    """Offline stand-in for a hub dataset: {"img", "label"} items, as flwr-datasets' CIFAR-10 gives them."""

    def __init__(self, partition_id: int, size: int = 24):
        rng = np.random.default_rng(partition_id)
        self.pixels = rng.integers(0, 256, (size, 32, 32, 3), dtype=np.uint8)
        self.labels = rng.integers(0, 10, size)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return {"img": pytorch_transforms(self.pixels[i]), "label": int(self.labels[i])}


def load_data(partition_id: int, num_partitions: int, batch_size: int):
    trainloader = DataLoader(Pictures(partition_id), batch_size=batch_size, shuffle=True)
    testloader = DataLoader(Pictures(partition_id + num_partitions), batch_size=batch_size)
    return trainloader, testloader


def train(net, trainloader, epochs, lr, device):
    net.to(device)
    criterion = torch.nn.CrossEntropyLoss().to(device)
    optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    net.train()
    running_loss = 0.0
    for _ in range(epochs):
        for batch in trainloader:
            images = batch["img"].to(device)
            labels = batch["label"].to(device)
            optimizer.zero_grad()
            loss = criterion(net(images), labels)
            loss.backward()
            optimizer.step()
            running_loss += loss.item()
    return running_loss / (epochs * len(trainloader))


def test(net, testloader, device):
    net.to(device)
    criterion = torch.nn.CrossEntropyLoss()
    correct, loss = 0, 0.0
    with torch.no_grad():
        for batch in testloader:
            outputs = net(batch["img"].to(device))
            loss += criterion(outputs, batch["label"].to(device)).item()
            correct += (outputs.argmax(1) == batch["label"]).sum().item()
    return loss / len(testloader), correct / len(testloader.dataset)
