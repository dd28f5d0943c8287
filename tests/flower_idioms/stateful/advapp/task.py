"""advapp: the model, the training transform and the loop."""

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader, Dataset
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


class Garments(Dataset):
    """Offline stand-in for a Fashion-MNIST partition: {"image", "label"} items, the training transform applied
    to each PIL image as flwr-datasets' ``with_transform`` would."""

    def __init__(self, partition_id: int, size: int = 48):
        rng = np.random.default_rng(2000 + partition_id)
        self.labels = rng.integers(0, 10, size)
        self.pixels = rng.integers(0, 256, (size, 28, 28), dtype=np.uint8)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return {"image": TRAIN_TRANSFORMS(Image.fromarray(self.pixels[i])), "label": int(self.labels[i])}


def load_data(partition_id: int, batch_size: int):
    return DataLoader(Garments(partition_id), batch_size=batch_size, shuffle=True)


def train(net, trainloader, epochs, lr, device):
    criterion = torch.nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    net.train()
    for _ in range(epochs):
        for batch in trainloader:
            optimizer.zero_grad()
            loss = criterion(net(batch["image"].to(device)), batch["label"].to(device))
            loss.backward()
            optimizer.step()
