"""vithead: the model (a ViT whose head is trained on a frozen backbone), the offline data, the training loop.

Shaped like Flower's ViT example: only ``model.heads`` is federated, the optimiser is Adam (built in the ClientApp
and handed to the loop), training images are randomly cropped and flipped. The backbone's weights come from a fixed
seed, standing in for a pretrained download.
"""

from collections import OrderedDict

import numpy as np
import timm
import torch
import torch.nn.functional as F
from torch import nn
from torchvision.transforms import v2

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)  # ImageNet's, as a pretrained ViT is fed


class ViTClassifier(nn.Module):
    """A small timm ViT backbone (32 px, patch 8, 2 blocks) and a linear classifier under ``heads.head``."""

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        torch.manual_seed(0)  # the public backbone: every build the same weights
        self.backbone = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8,
                                          embed_dim=48, depth=2, num_heads=3, num_classes=0)
        self.heads = nn.Sequential(OrderedDict(head=nn.Linear(48, num_classes)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.heads(self.backbone(x))


def get_model(num_classes: int) -> ViTClassifier:
    """The app's model; the backbone frozen, as the app fine-tunes the head only."""
    model = ViTClassifier(num_classes)
    model.backbone.requires_grad_(False)
    return model


def partition_size(sizes: str, partition_id: int) -> int:
    values = [int(s) for s in sizes.split(",")]
    return values[partition_id % len(values)]


def load_pixels(partition_id: int, size: int, seed: int, num_classes: int = 10) -> tuple[np.ndarray, list[int]]:
    """A client's images as a dataset stores them, uint8 [N, H, W, C], and their labels: per class a fixed smooth
    colour pattern, per image a random shift, brightness and noise."""
    patterns = np.random.default_rng(seed).random((num_classes, 4, 4, 3))
    rng = np.random.default_rng(seed * 1000 + partition_id)
    labels = rng.integers(0, num_classes, size)
    big = torch.nn.functional.interpolate(torch.as_tensor(patterns).permute(0, 3, 1, 2), size=40, mode="bicubic")
    big = big.permute(0, 2, 3, 1).numpy()
    images = np.empty((size, 32, 32, 3), np.uint8)
    for i, label in enumerate(labels):
        top, left = rng.integers(0, 9, 2)
        image = big[label, top : top + 32, left : left + 32] * rng.uniform(0.7, 1.0) + 0.1 * rng.standard_normal(
            (32, 32, 3))
        images[i] = np.clip(image * 255, 0, 255).astype(np.uint8)
    return images, labels.tolist()


def as_tensors(pixels: np.ndarray, labels: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The usual conversion: [N, C, H, W] floats in [0, 1] (a permuted, channels-last view) and a label tensor."""
    return torch.from_numpy(pixels).permute(0, 3, 1, 2).float() / 255, torch.tensor(labels)


def normalize(x: torch.Tensor) -> torch.Tensor:
    return (x - torch.tensor(MEAN).view(1, 3, 1, 1)) / torch.tensor(STD).view(1, 3, 1, 1)


AUGMENT = v2.Compose([v2.RandomResizedCrop(32, scale=(0.5, 1.0), antialias=True), v2.RandomHorizontalFlip()])


def train(model: ViTClassifier, images: torch.Tensor, labels: torch.Tensor, optimizer: torch.optim.Optimizer,
          epochs: int, batch_size: int, seed: int) -> float:
    """The optimiser the ClientApp built, every training image randomly cropped and flipped; returns the mean
    training loss."""
    torch.manual_seed(seed)
    model.train()
    losses = []
    for _ in range(epochs):
        order = torch.randperm(len(labels))
        for first in range(0, len(labels), batch_size):
            batch = order[first : first + batch_size]
            x = torch.stack([AUGMENT(image) for image in images[batch]])
            loss = F.cross_entropy(model(normalize(x)), labels[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return float(np.mean(losses))


def test(model: ViTClassifier, images: torch.Tensor, labels: torch.Tensor) -> tuple[float, float]:
    model.eval()
    with torch.no_grad():
        logits = model(normalize(images))
        return F.cross_entropy(logits, labels).item(), float((logits.argmax(1) == labels).float().mean())
