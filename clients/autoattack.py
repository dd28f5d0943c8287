"""AutoAttack (Croce & Hein, ICML 2020) from the Adversarial Robustness Toolbox, for ``robust.attack = "autoattack"``.

ART's :class:`AutoAttack` runs its attacks one after the other, each on the samples no earlier attack has broken
(a sample counts as robust only if it survives all). Versions (fedvit's names):

- ``standard``: APGD-CE and APGD-DLR, untargeted and then targeted at every other class (targeted APGD-DLR is
  AutoAttack's APGD-T), then Square (5000 queries, p_init 0.8) untargeted: the attacks and budgets of AutoAttack's
  standard version (100 APGD iterations, initial step 2ε, 1 restart) plus untargeted APGD-DLR and targeted
  APGD-CE, and without FAB-T, which ART does not implement.
- ``apgd``: the APGD stage alone (no Square): the cheaper per-round subset, still containing APGD-CE + APGD-T.

The model is wrapped so that the attack works in [0, 1] pixel space: fedvit's normalisation runs inside the forward
pass, as in :func:`core.model.classify`. ART draws its random starts and Square's proposals from numpy's and torch's
global generators; :func:`autoattack_correct` seeds both and restores their previous states afterwards.
"""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import torch
from torch import nn

from core.config import RobustConfig
from core.data import ImageSet, stratified_subset
from core.model import classify

VERSIONS = ("standard", "apgd")
APGD_ITERATIONS = 100  # AutoAttack's budget (Croce & Hein 2020, Sec. 4)
SQUARE_QUERIES = 5000
SQUARE_P_INIT = 0.8


class PixelSpaceModel(nn.Module):
    """``classify(model, x)`` as a module: logits of [0, 1] pixels, normalisation included."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return classify(self.model, x)


@contextmanager
def _seeded(seed: int):
    numpy_state, torch_state = np.random.get_state(), torch.random.get_rng_state()
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    try:
        yield
    finally:
        np.random.set_state(numpy_state)
        torch.random.set_rng_state(torch_state)


def _estimator(model: nn.Module, num_classes: int, img_size: int):
    from art.estimators.classification import PyTorchClassifier

    device = next(model.parameters()).device
    return PyTorchClassifier(
        model=PixelSpaceModel(model),
        loss=nn.CrossEntropyLoss(),
        input_shape=(3, img_size, img_size),
        nb_classes=num_classes,
        clip_values=(0.0, 1.0),
        device_type="gpu" if device.type == "cuda" else "cpu",
    )


def build_stages(
    model: nn.Module,
    num_classes: int,
    img_size: int,
    eps: float,
    version: str,
    batch_size: int,
    square_queries: int = SQUARE_QUERIES,
):
    """The stages of ``version``, each an ART :class:`AutoAttack` (L∞, radius ``eps`` in [0, 1] pixels), run in
    order on the samples no earlier stage broke: APGD-CE and APGD-DLR untargeted and then targeted at every other
    class; for ``standard`` then Square, untargeted (ART would otherwise also run Square targeted, 9x the queries).
    ``square`` (Square alone) is the gradient-free reference of ``fedvit robustness-check``."""
    from art.attacks.evasion import AutoAttack, AutoProjectedGradientDescent, SquareAttack

    if version not in (*VERSIONS, "square"):
        raise ValueError(f"unknown AutoAttack version {version!r}; one of {VERSIONS}")
    estimator = _estimator(model, num_classes, img_size)
    apgd = {"estimator": estimator, "norm": np.inf, "eps": eps, "eps_step": 2 * eps, "max_iter": APGD_ITERATIONS,
            "nb_random_init": 1, "batch_size": batch_size, "verbose": False}  # fmt: skip
    ensemble = {"norm": np.inf, "eps": eps, "eps_step": 2 * eps, "batch_size": batch_size}
    stages = []
    if version in VERSIONS:
        pair = [
            AutoProjectedGradientDescent(loss_type=loss, **apgd)
            for loss in ("cross_entropy", "difference_logits_ratio")
        ]
        stages.append(AutoAttack(estimator, attacks=pair, targeted=True, **ensemble))
    if version in ("standard", "square"):
        square = SquareAttack(estimator=estimator, norm=np.inf, eps=eps, max_iter=square_queries,
                              p_init=SQUARE_P_INIT, nb_restarts=1, batch_size=batch_size, verbose=False)  # fmt: skip
        stages.append(AutoAttack(estimator, attacks=[square], targeted=False, **ensemble))
    return stages


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
    was_training = model.training
    trainable = [p for p in model.parameters() if p.requires_grad]
    model.eval()
    for p in trainable:  # ART calls backward(): input gradients only, and no .grad left on the weights
        p.requires_grad_(False)
    try:
        with torch.no_grad():
            correct = classify(model, x).argmax(1) == y
        for stage in build_stages(model, num_classes, x.shape[-1], eps, version, len(x), square_queries):
            if not correct.any():
                break
            keep = correct.nonzero().flatten()
            with _seeded(seed):
                adv = stage.generate(x[keep].detach().cpu().numpy().astype(np.float32), y=y[keep].cpu().numpy())
            adv_t = torch.as_tensor(adv, device=x.device)
            if not torch.all((adv_t - x[keep]).abs() <= eps + 1e-6):  # the threat model, checked, not trusted
                raise RuntimeError("AutoAttack left the L∞ ball")
            with torch.no_grad():
                correct[keep] = classify(model, adv_t).argmax(1) == y[keep]
        return correct
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
    class-stratified ``settings.max_samples`` of ``indices`` as :func:`clients.adversarial.robust_accuracy`."""
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
