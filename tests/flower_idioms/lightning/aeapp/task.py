"""aeapp: the LightningModule (a reconstruction loss, no labels) and its loaders."""

import lightning.pytorch as pl
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset


class LitAutoEncoder(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(28 * 28, 64), nn.ReLU(), nn.Linear(64, 3))
        self.decoder = nn.Sequential(nn.Linear(3, 64), nn.ReLU(), nn.Linear(64, 28 * 28))

    def forward(self, x):
        return self.encoder(x)

    def configure_optimizers(self):
        optimizer = torch.optim.Adam(self.parameters(), lr=1e-3)
        return optimizer

    def training_step(self, train_batch, batch_idx):
        x = train_batch["image"]
        x = x.view(x.size(0), -1)
        z = self.encoder(x)
        x_hat = self.decoder(z)
        loss = F.mse_loss(x_hat, x)
        self.log("train_loss", loss)
        return loss


class Digits(Dataset):
    """Offline stand-in for an MNIST partition: {"image"} items of one grey channel, no labels used."""

    def __init__(self, partition_id: int, size: int = 40):
        rng = np.random.default_rng(3000 + partition_id)
        self.pixels = rng.random((size, 1, 28, 28), dtype=np.float32)

    def __len__(self):
        return len(self.pixels)

    def __getitem__(self, i):
        return {"image": torch.from_numpy(self.pixels[i]), "label": 0}


def load_data(partition_id: int, num_partitions: int):
    trainloader = DataLoader(Digits(partition_id), batch_size=32, shuffle=True)
    return trainloader
