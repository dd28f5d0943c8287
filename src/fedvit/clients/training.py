"""Local client work: one FedSGD gradient, FedAvg local epochs, evaluation. Pure torch, no Flower."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedvit.core.data import ImageSet
from fedvit.core.model import classify


@dataclass
class StepResult:
    """What a local step produced: named float32 arrays plus its statistics."""

    arrays: OrderedDict[str, np.ndarray]
    num_examples: int
    loss: float
    accuracy: float
    # the images the client trained on (FedSGD: its batch; FedAvg: its partition), for the audit's ground truth
    batch_indices: np.ndarray | None = None
    steps: int = 1  # local optimiser steps taken (SCAFFOLD's K)
    adversarial: int = 0  # samples replaced by adversarial versions (Madry AT)


# (model, pixels, labels) -> (pixels with some samples replaced, how many were replaced); see fedvit.clients.adversarial
BatchAdversary = Callable[[nn.Module, torch.Tensor, torch.Tensor], tuple[torch.Tensor, int]]
REFERENCE_SIZE, REFERENCE_PAD = 224, 28  # FedWAvg paper, Sec. 4.1: random crop with padding 28 at 224 px


def crop_flip(x: torch.Tensor, rng: np.random.Generator) -> torch.Tensor:
    """Random crop with zero padding (28 px at 224, scaled to the image size) and random horizontal flip."""
    size = x.shape[-1]
    pad = max(1, round(REFERENCE_PAD * size / REFERENCE_SIZE))
    padded = F.pad(x, (pad, pad, pad, pad))
    offsets = rng.integers(0, 2 * pad + 1, size=(len(x), 2))
    flips = rng.random(len(x)) < 0.5
    out = torch.stack([padded[i, :, r : r + size, c : c + size] for i, (r, c) in enumerate(offsets)])
    out[torch.as_tensor(flips)] = out[torch.as_tensor(flips)].flip(-1)
    return out


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
    augment: bool = False,
    adversary: BatchAdversary | None = None,
) -> StepResult:
    """Gradient θ of the mean cross-entropy on one local batch (FedSGD; random-binary-weights paper, eq. 10)."""
    picked = rng.choice(train_idx, size=min(batch_size, len(train_idx)), replace=False)
    x, y = images.batch(np.sort(picked), img_size)
    x = crop_flip(x, rng) if augment else x
    x, y = x.to(device), y.to(device)
    replaced = 0
    if adversary is not None:
        x, replaced = adversary(model, x, y)
    model.train()
    model.zero_grad(set_to_none=True)
    logits = classify(model, x)
    loss = F.cross_entropy(logits, y)
    loss.backward()
    grads = OrderedDict(
        (name, p.grad.detach().to("cpu", torch.float32).numpy().copy()) for name, p in model.named_parameters()
    )
    accuracy = (logits.argmax(1) == y).float().mean().item()
    return StepResult(grads, len(y), loss.item(), accuracy, np.sort(picked), adversarial=replaced)


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
    augment: bool = False,
    adversary: BatchAdversary | None = None,
    proximal_mu: float = 0.0,
    correction: dict[str, np.ndarray] | None = None,
) -> StepResult:
    """Local training: ``epochs`` passes of SGD over shuffled local data; returns the new weights.

    FedAvg/FedWAvg as is (Algorithm 1, lines 11-21, with ``adversary`` for Madry AT). FedProx adds
    μ/2 · ‖w − w_global‖² to the loss (``proximal_mu``); SCAFFOLD adds ``correction`` = c − c_i to every
    gradient before the step (Karimireddy et al., 2020, Algorithm 1, line 10).
    """
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    params = dict(model.named_parameters())
    anchor = {n: p.detach().clone() for n, p in params.items()} if proximal_mu > 0 else None
    shift = {n: torch.as_tensor(c, device=device) for n, c in correction.items()} if correction else None
    total_loss, correct, seen, steps, replaced = 0.0, 0, 0, 0, 0
    for _ in range(epochs):
        order = rng.permutation(train_idx)
        for start in range(0, len(order), batch_size):
            x, y = images.batch(order[start : start + batch_size], img_size)
            x = crop_flip(x, rng) if augment else x
            x, y = x.to(device), y.to(device)
            if adversary is not None:
                x, n_adv = adversary(model, x, y)
                replaced += n_adv
            model.train()
            optimizer.zero_grad(set_to_none=True)
            logits = classify(model, x)
            loss = F.cross_entropy(logits, y)
            objective = loss
            if anchor is not None:
                objective = loss + proximal_mu / 2 * sum(((params[n] - anchor[n]) ** 2).sum() for n in params)
            objective.backward()
            if shift is not None:
                for name, p in params.items():
                    if p.grad is None:  # unused this step: its gradient is zero, the correction still applies
                        p.grad = torch.zeros_like(p)
                    p.grad.add_(shift[name])
            optimizer.step()
            total_loss += loss.item() * len(y)
            correct += (logits.argmax(1) == y).sum().item()
            seen += len(y)
            steps += 1
    weights = OrderedDict(
        (name, p.detach().to("cpu", torch.float32).numpy().copy()) for name, p in model.named_parameters()
    )
    return StepResult(
        weights,
        len(train_idx),
        total_loss / max(seen, 1),
        correct / max(seen, 1),
        batch_indices=np.sort(train_idx),
        steps=steps,
        adversarial=replaced,
    )


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
