"""vitb16: torchvision's ViT-B/16 with a new head, only ``heads`` trained (the backbone frozen), Adam, random resized
crops at 224 px; the weights from a fixed seed stand in for the ImageNet download."""

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torchvision.models import vit_b_16
from torchvision.transforms import v2

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
TRAIN_TRANSFORM = v2.Compose([v2.RandomResizedCrop((224, 224), antialias=True), v2.Normalize(MEAN, STD)])
EVAL_TRANSFORM = v2.Normalize(MEAN, STD)


def get_model(num_classes: int) -> nn.Module:
    torch.manual_seed(0)  # the "pretrained" backbone: the same weights in every build
    model = vit_b_16()
    model.heads = nn.Sequential(nn.Linear(768, num_classes))
    model.requires_grad_(False)
    model.heads.requires_grad_(True)
    return model


def load_data(partition_id: int, size: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """Offline photograph-like images at 224 px (the third-party app's textures, upsampled) and labels."""
    from cnnapp.task import make_textures

    images, labels = make_textures(size, 100 + partition_id, 0.5)
    big = F.interpolate(torch.as_tensor(images, dtype=torch.float32), size=224, mode="bilinear")
    return big.clamp(0, 1), torch.as_tensor(labels)


def train(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, optimizer: torch.optim.Optimizer,
          epochs: int, batch_size: int) -> float:
    model.train()
    losses = []
    for _ in range(epochs):
        order = torch.randperm(len(labels))
        for first in range(0, len(labels), batch_size):
            batch = order[first : first + batch_size]
            x = torch.stack([TRAIN_TRANSFORM(image) for image in images[batch]])
            loss = F.cross_entropy(model(x), labels[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return float(np.mean(losses))
