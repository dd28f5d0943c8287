"""L∞ PGD (Madry et al., 2018) and Madry adversarial training (FedWAvg paper, Algorithm 1, lines 14-18).

Everything happens in [0, 1] pixel space: the perturbation is added before the model's normalisation
(:func:`fedvit.core.model.classify` normalises) and every iterate is clamped to the valid pixel range.
Randomness comes from an explicit ``torch.Generator`` / numpy generator, so a seeded client is deterministic.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedvit.core.config import AdversarialConfig, RobustConfig
from fedvit.core.data import ImageSet, stratified_subset
from fedvit.core.model import classify


@dataclass(frozen=True)
class PGD:
    """Attack A_{s,ε,α}: ``steps`` signed-gradient steps of size ``alpha`` inside the L∞ ball of radius ``eps``,
    from a uniform random start in the ball; ``restarts`` > 1 keeps, per sample, the first restart that fools
    the model (evaluation only)."""

    eps: float = 8 / 255
    alpha: float = 2 / 255
    steps: int = 7
    restarts: int = 1

    def __post_init__(self) -> None:
        if not (self.eps >= 0 and self.alpha > 0 and self.steps >= 1 and self.restarts >= 1):
            raise ValueError(f"invalid PGD settings: {self}")


def pgd(model: nn.Module, x: torch.Tensor, y: torch.Tensor, attack: PGD, generator: torch.Generator) -> torch.Tensor:
    """Adversarial versions of pixels ``x`` (in [0, 1]) for labels ``y``: maximise the cross-entropy over
    ``‖x' − x‖∞ ≤ ε`` ∩ [0, 1]^d. The model's train/eval mode and its gradients are left as they were."""
    was_training = model.training
    model.eval()  # no dropout noise while crafting; ViTs have no batch statistics to protect
    x = x.detach()
    best = torch.empty_like(x)
    fooled = torch.zeros(len(x), dtype=torch.bool, device=x.device)
    try:
        for _ in range(attack.restarts):
            noise = torch.rand(x.shape, generator=generator, device=generator.device, dtype=x.dtype)
            adv = (x + (2 * noise.to(x.device) - 1) * attack.eps).clamp(0, 1)
            for _ in range(attack.steps):
                adv.requires_grad_(True)
                loss = F.cross_entropy(classify(model, adv), y)
                (grad,) = torch.autograd.grad(loss, adv)
                adv = adv.detach() + attack.alpha * grad.sign()
                adv = torch.min(torch.max(adv, x - attack.eps), x + attack.eps).clamp(0, 1)
            best[~fooled] = adv[~fooled]  # a sample keeps the first restart that fooled the model
            if attack.restarts > 1:
                with torch.no_grad():
                    fooled |= classify(model, adv).argmax(1) != y
    finally:
        model.train(was_training)
    return best.detach()


def madry_batch(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    ratio: float,
    attack: PGD,
    rng: np.random.Generator,
    generator: torch.Generator,
) -> tuple[torch.Tensor, np.ndarray]:
    """Algorithm 1, lines 14-18: replace a random subset of ⌊r·B⌋ samples of the batch by their PGD versions.

    Returns the mixed batch (same order as ``x``) and the positions that were replaced.
    """
    n_adv = int(np.floor(ratio * len(x)))
    if n_adv == 0:
        return x, np.array([], dtype=np.int64)
    chosen = np.sort(rng.choice(len(x), size=n_adv, replace=False))
    index = torch.as_tensor(chosen, device=x.device)
    mixed = x.clone()
    mixed[index] = pgd(model, x[index], y[index], attack, generator)
    return mixed, chosen


def torch_generator(seed_words: list[int], device: torch.device) -> torch.Generator:
    """A torch generator on ``device`` seeded from integers (e.g. [seed, round, partition])."""
    generator = torch.Generator(device=device)
    generator.manual_seed(int(np.random.SeedSequence(seed_words).generate_state(1, np.uint64)[0] >> 1))
    return generator


def robust_correct(model: nn.Module, x: torch.Tensor, y: torch.Tensor, attack: PGD, generator) -> torch.Tensor:
    """Per sample: still classified correctly after the attack (all restarts)?"""
    adv = pgd(model, x, y, attack, generator)
    with torch.no_grad():
        return classify(model, adv).argmax(1) == y


def madry_adversary(
    attack: PGD, ratio: float, seed_words: list[int], device: torch.device
) -> Callable[[nn.Module, torch.Tensor, torch.Tensor], tuple[torch.Tensor, int]]:
    """A batch hook for local training: :func:`madry_batch` with generators seeded by ``seed_words``
    (e.g. [seed, round, partition]), so a client's adversarial round is reproducible."""
    rng = np.random.default_rng([*seed_words, 1])  # a stream apart from the client's batch sampling
    generator = torch_generator(seed_words, device)

    def adversary(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, int]:
        mixed, replaced = madry_batch(model, x, y, ratio, attack, rng, generator)
        return mixed, len(replaced)

    return adversary


def attack_from(settings: AdversarialConfig | RobustConfig) -> PGD:
    """The PGD attack of a config group (ε and α are given in units of 1/255)."""
    restarts = getattr(settings, "restarts", 1)
    return PGD(eps=settings.eps_255 / 255, alpha=settings.alpha_255 / 255, steps=settings.steps, restarts=restarts)


def robust_accuracy(
    model: nn.Module,
    images: ImageSet,
    indices: np.ndarray,
    img_size: int,
    device: torch.device,
    settings: RobustConfig,
    seed_words: list[int],
    subset_seed: int,
    batch_size: int = 64,
) -> float:
    """Accuracy on PGD versions (the ``robust.*`` attack) of ``settings.max_samples`` of ``indices`` (all when 0);
    a sample counts only if it survives every restart. ``seed_words`` seed the attack's random starts; the subset
    is class-stratified and seeded by ``subset_seed`` alone (the run seed), so every round measures the same images."""
    indices = stratified_subset(images.labels, indices, settings.max_samples, subset_seed)
    attack, generator = attack_from(settings), torch_generator(seed_words, device)
    correct = 0
    for start in range(0, len(indices), batch_size):
        x, y = images.batch(indices[start : start + batch_size], img_size)
        correct += int(robust_correct(model, x.to(device), y.to(device), attack, generator).sum().item())
    return correct / max(len(indices), 1)
