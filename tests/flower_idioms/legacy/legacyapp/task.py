"""legacyapp: the model, the data and the loop; the batch size lives only in the DataLoader."""

from collections import OrderedDict

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset
from torchvision.transforms import Compose, Normalize, ToTensor


class Net(nn.Module):
    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 4 * 4, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, num_classes)

    def forward(self, x):
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = x.view(-1, 16 * 4 * 4)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


class Digits(Dataset):
    """Offline stand-in for MNIST: {"image", "label"} items of one grey channel."""

    transform = Compose([ToTensor(), Normalize((0.5,), (0.5,))])

    def __init__(self, partition_id: int, size: int = 40):
        rng = np.random.default_rng(1000 + partition_id)
        self.pixels = rng.integers(0, 256, (size, 28, 28), dtype=np.uint8)
        self.labels = rng.integers(0, 10, size)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return {"image": self.transform(self.pixels[i]), "label": int(self.labels[i])}


def load_data(partition_id: int, num_partitions: int):
    trainloader = DataLoader(Digits(partition_id), batch_size=32, shuffle=True)
    testloader = DataLoader(Digits(partition_id + num_partitions), batch_size=32)
    return trainloader, testloader


def train(net, trainloader, optim, epochs, device: str):
    criterion = torch.nn.CrossEntropyLoss()
    net.train()
    for _ in range(epochs):
        for batch in trainloader:
            images, labels = batch["image"].to(device), batch["label"].to(device)
            optim.zero_grad()
            loss = criterion(net(images), labels)
            loss.backward()
            optim.step()


def test(net, testloader, device: str):
    criterion = torch.nn.CrossEntropyLoss()
    correct, loss = 0, 0.0
    net.eval()
    with torch.no_grad():
        for batch in testloader:
            images, labels = batch["image"].to(device), batch["label"].to(device)
            outputs = net(images)
            loss += criterion(outputs, labels).item()
            correct += (outputs.argmax(1) == labels).sum().item()
    return loss, correct / len(testloader.dataset)


def get_weights(net):
    return [val.cpu().numpy() for _, val in net.state_dict().items()]


def set_weights(net, parameters):
    state_dict = OrderedDict({k: torch.tensor(v) for k, v in zip(net.state_dict().keys(), parameters, strict=True)})
    net.load_state_dict(state_dict, strict=True)
