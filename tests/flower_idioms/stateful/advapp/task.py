"""advapp: the model, the training transform and the loop."""

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader
from torchvision.transforms import Compose, Normalize, RandomCrop, RandomHorizontalFlip, ToTensor

FM_NORMALIZATION = ((0.2860,), (0.3530,))
TRAIN_TRANSFORMS = Compose([RandomCrop(28, padding=4), RandomHorizontalFlip(), ToTensor(),
                            Normalize(*FM_NORMALIZATION)])


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3)
        self.fc1 = nn.Linear(32 * 13 * 13, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.relu(self.fc1(torch.flatten(x, 1)))
        return self.fc2(x)


def load_data(partition, batch_size: int):
    return DataLoader(partition.with_transform(TRAIN_TRANSFORMS), batch_size=batch_size, shuffle=True)


def train(net, trainloader, epochs, lr, device):
    criterion = torch.nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(net.parameters(), lr=lr)
    net.train()
    for _ in range(epochs):
        for batch in trainloader:
            optimizer.zero_grad()
            loss = criterion(net(batch["image"].to(device)), batch["label"].to(device))
            loss.backward()
            optimizer.step()
