"""AutoAttack (Croce & Hein, ICML 2020) from its authors' reference implementation (PyPI ``pyautoattack``), for
``robust.attack = "autoattack"``.

AutoAttack runs its attacks one after the other, each on the samples no earlier attack has broken (a sample
counts as robust only if it survives all). Versions (fedvit's names):

- ``standard``: AutoAttack's standard version unchanged: APGD-CE (100 iterations, 1 restart), APGD-T (targeted
  APGD-DLR, 9 target classes), FAB-T (9 target classes) and Square (5000 queries, p_init 0.8).
- ``apgd``: APGD-CE + APGD-T alone, the cheaper per-round subset.

With fewer than 10 classes the targeted attacks aim at every other class. The model is wrapped so that the attack
works in [0, 1] pixel space: fedvit's normalisation runs inside the forward pass, as in
:func:`fedvit.core.model.classify`. The attacks seed torch's global generators themselves; :func:`autoattack_correct`
restores their previous states afterwards.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from fedvit.core.config import RobustConfig
from fedvit.core.data import ImageSet, stratified_subset
from fedvit.core.model import classify

if TYPE_CHECKING:  # imported where an attack is built: the package is large and only robust evaluation needs it
    from pyautoattack import AutoAttack

VERSIONS = ("standard", "apgd")
ATTACKS = {"standard": ["apgd-ce", "apgd-t", "fab-t", "square"], "apgd": ["apgd-ce", "apgd-t"], "square": ["square"]}
SQUARE_QUERIES = 5000  # AutoAttack's standard budget


class PixelSpaceModel(nn.Module):
    """``classify(model, x)`` as a module: logits of [0, 1] pixels, normalisation included."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return classify(self.model, x)


@contextmanager
def _restored_random_state(device: torch.device):
    cpu = torch.random.get_rng_state()
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    try:
        yield
    finally:
        torch.random.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state(cuda, device)


def build_autoattack(
    model: nn.Module,
    num_classes: int,
    eps: float,
    version: str,
    seed: int,
    square_queries: int = SQUARE_QUERIES,
) -> AutoAttack:
    """AutoAttack ``version`` (L∞, radius ``eps`` in [0, 1] pixels) on ``model``; ``square`` (Square alone) is
    the gradient-free reference of ``fedvit robustness-check``."""
    from pyautoattack import AutoAttack

    if version not in ATTACKS:
        raise ValueError(f"unknown AutoAttack version {version!r}; one of {VERSIONS}")
    device = next(model.parameters()).device
    attack = AutoAttack(PixelSpaceModel(model), attacks=ATTACKS[version], eps=eps, norm="Linf", seed=seed,
                        version="custom", device=device)  # fmt: skip
    # The settings of pyautoattack's standard version (AutoAttack._set_version), for every version.
    attack.apgd.n_restarts = 1
    attack.apgd_targeted.n_restarts = 1
    attack.fab.n_restarts = 1
    attack.apgd_targeted.n_target_classes = attack.fab.n_target_classes = min(9, num_classes - 1)
    attack.square.n_queries = square_queries
    attack.verbose = False
    return attack


def autoattack_correct(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    num_classes: int,
    eps: float,
    version: str,
    seed: int,
    square_queries: int = SQUARE_QUERIES,
) -> torch.Tensor:
    """Per sample: still classified correctly after every attack of ``version`` (labels ``y`` are the truth);
    ``square_queries`` below AutoAttack's 5000 makes Square cheaper and weaker (``fedvit robustness-check``)."""
    attack = build_autoattack(model, num_classes, eps, version, seed, square_queries)
    was_training = model.training
    trainable = [p for p in model.parameters() if p.requires_grad]
    model.eval()
    for p in trainable:  # input gradients only, and no .grad left on the weights
        p.requires_grad_(False)
    try:
        with _restored_random_state(x.device):
            adv, _ = attack.run_standard_evaluation(x.detach(), y, batch_size=len(x))
        if not torch.all((adv - x).abs() <= eps + 1e-6):  # the threat model, checked, not trusted
            raise RuntimeError("AutoAttack left the L∞ ball")
        with torch.no_grad():
            return classify(model, adv).argmax(1) == y
    finally:
        model.train(was_training)
        for p in trainable:
            p.requires_grad_(True)


def autoattack_accuracy(
    model: nn.Module,
    images: ImageSet,
    indices: np.ndarray,
    img_size: int,
    settings: RobustConfig,
    seed_words: list[int],
    subset_seed: int,
    batch_size: int = 64,
) -> float:
    """Accuracy under AutoAttack (``settings.version``, ε = ``settings.eps_255``/255) on the same seeded
    class-stratified ``settings.max_samples`` of ``indices`` as :func:`fedvit.clients.adversarial.robust_accuracy`."""
    indices = stratified_subset(images.labels, indices, settings.max_samples, subset_seed)
    device = next(model.parameters()).device
    seed = int(np.random.SeedSequence(seed_words).generate_state(1)[0])
    correct = 0
    for start in range(0, len(indices), batch_size):
        x, y = images.batch(indices[start : start + batch_size], img_size)
        eps = settings.eps_255 / 255
        survived = autoattack_correct(
            model, x.to(device), y.to(device), images.num_classes, eps, settings.version, seed + start
        )
        correct += int(survived.sum().item())
    return correct / max(len(indices), 1)
