"""Local client work: one FedSGD gradient, FedAvg local epochs, evaluation. Pure torch, no Flower."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedvit_app.data import ImageSet
from fedvit_app.model import classify


@dataclass
class StepResult:
    """What a local step produced: named float32 arrays plus its statistics."""

    arrays: OrderedDict[str, np.ndarray]
    num_examples: int
    loss: float
    accuracy: float
    batch_indices: np.ndarray | None = None  # FedSGD: the images of the batch (for the audit's ground truth)


def batch_rng(seed: int, server_round: int, partition_id: int) -> np.random.Generator:
    """The client's private sampling generator for one round (never global state)."""
    return np.random.default_rng([seed, server_round, partition_id])


def fedsgd_gradient(
    model: nn.Module,
    images: ImageSet,
    train_idx: np.ndarray,
    batch_size: int,
    img_size: int,
    rng: np.random.Generator,
    device: torch.device,
) -> StepResult:
    """Gradient θ of the mean cross-entropy on one local batch (FedSGD; random-binary-weights paper, eq. 10)."""
    picked = rng.choice(train_idx, size=min(batch_size, len(train_idx)), replace=False)
    x, y = images.batch(np.sort(picked), img_size)
    x, y = x.to(device), y.to(device)
    model.train()
    model.zero_grad(set_to_none=True)
    logits = classify(model, x)
    loss = F.cross_entropy(logits, y)
    loss.backward()
    grads = OrderedDict(
        (name, p.grad.detach().to("cpu", torch.float32).numpy().copy()) for name, p in model.named_parameters()
    )
    accuracy = (logits.argmax(1) == y).float().mean().item()
    return StepResult(grads, len(y), loss.item(), accuracy, np.sort(picked))


def local_epochs(
    model: nn.Module,
    images: ImageSet,
    train_idx: np.ndarray,
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    momentum: float,
    img_size: int,
    rng: np.random.Generator,
    device: torch.device,
) -> StepResult:
    """FedAvg local training: ``epochs`` passes of SGD over shuffled local data; returns the new weights."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    model.train()
    total_loss, correct, seen = 0.0, 0, 0
    for _ in range(epochs):
        order = rng.permutation(train_idx)
        for start in range(0, len(order), batch_size):
            x, y = images.batch(order[start : start + batch_size], img_size)
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad(set_to_none=True)
            logits = classify(model, x)
            loss = F.cross_entropy(logits, y)
            loss.backward()
            optimizer.step()
            total_loss += loss.item() * len(y)
            correct += (logits.argmax(1) == y).sum().item()
            seen += len(y)
    weights = OrderedDict(
        (name, p.detach().to("cpu", torch.float32).numpy().copy()) for name, p in model.named_parameters()
    )
    return StepResult(weights, len(train_idx), total_loss / max(seen, 1), correct / max(seen, 1))


@torch.no_grad()
def evaluate(
    model: nn.Module, images: ImageSet, indices: np.ndarray, img_size: int, device: torch.device, batch_size: int = 256
) -> tuple[float, float, int]:
    """Mean cross-entropy and accuracy of ``model`` on ``indices``; returns (loss, accuracy, count)."""
    model.eval()
    total_loss, correct = 0.0, 0
    for start in range(0, len(indices), batch_size):
        x, y = images.batch(indices[start : start + batch_size], img_size)
        x, y = x.to(device), y.to(device)
        logits = classify(model, x)
        total_loss += F.cross_entropy(logits, y, reduction="sum").item()
        correct += (logits.argmax(1) == y).sum().item()
    n = len(indices)
    return total_loss / max(n, 1), correct / max(n, 1), n
