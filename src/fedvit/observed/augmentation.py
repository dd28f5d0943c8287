"""The random augmentation a client trains under, as declared to the audit (``--recipe augment=crop+flip``).

A client that trains on random crops and flips never trains on the images the audit scores, but on views drawn
from each image's augmentation distribution. The audit follows it: its simulations of local training draw a fresh
view of every image at every visit, and the loss scores average each candidate's loss over :data:`VIEWS` views
(the augmentation-aware loss attack: Choquette-Choo et al., "Label-Only Membership Inference Attacks", ICML 2021,
arXiv 2007.14321, score members by their loss over augmented copies). The shadow alignment scores the images as
they are. Names: ``crop`` (torchvision's RandomResizedCrop back to the input size, scale 0.08–1 and aspect
3/4–4/3: its defaults), ``crop:S`` (scale S–1), ``pad:P`` (torchvision's RandomCrop at the input size with
``padding=P``: the image zero-padded by P pixels on every side, then a random window of the input's size: a shift of
up to P pixels either way), ``flip`` (horizontal, probability ½), joined by ``+``.
"""

from __future__ import annotations

import dataclasses

import torch

VIEWS = 8  # views per candidate in the loss scores
RATIO = (3 / 4, 4 / 3)


class AugmentationError(ValueError):
    """An augmentation name the audit does not model."""


@dataclasses.dataclass(frozen=True)
class Augmentation:
    """Random resized crops (``crop_scale``: the smallest area share; None: no crop), random crops of the input's
    size from the image zero-padded by ``padding`` pixels (None: none) and horizontal flips."""

    crop_scale: float | None = None
    flip: bool = False
    padding: int | None = None
    bank: int = 0  # > 0: the inputs hold this many views per image, precomputed (a frozen backbone's, :func:`banked`)

    def describe(self) -> str:
        parts = ([f"random resized crop (scale {self.crop_scale:g}–1)"] if self.crop_scale is not None else []) + (
            [f"random crop with padding {self.padding}"] if self.padding is not None else []) + (
            ["horizontal flip"] if self.flip else []
        )  # fmt: skip
        return " + ".join(parts) + (f" (drawn from a bank of {self.bank} views per image)" if self.bank else "")


def parse(text: str) -> Augmentation | None:
    """``crop``, ``crop:0.5``, ``flip`` joined by ``+`` (``none``: None); one error naming what is accepted."""
    text = text.strip().lower()
    if text in ("", "none", "no", "false"):
        return None
    crop, flip, padding = None, False, None
    for part in text.split("+"):
        name, _, value = part.strip().partition(":")
        if name == "flip" and not value:
            flip = True
        elif name == "pad":
            if not value.isdigit() or int(value) < 1:
                raise AugmentationError(f"augment {text!r}: pad needs a positive number of pixels, got {value!r}")
            padding = int(value)
        elif name == "crop":
            try:
                crop = float(value) if value else 0.08
            except ValueError:
                crop = -1.0
            if not 0 < crop <= 1:
                raise AugmentationError(f"augment {text!r}: crop's scale must be in (0, 1], got {value!r}")
        else:
            raise AugmentationError(f"augment {text!r}: {part!r} is not modelled (crop, crop:S, pad:P, flip, joined by "
                                    "+)")  # fmt: skip
    return Augmentation(crop, flip, padding)


def augmented(images: torch.Tensor, augmentation: Augmentation, generator: torch.Generator) -> torch.Tensor:
    """One random view of each image [n, C, H, W] (pixels in [0, 1]), its randomness from ``generator``; of a bank
    (``augmentation.bank``): one of each input's precomputed views (:func:`banked`)."""
    if augmentation.bank:
        return banked(images, torch.randint(1, augmentation.bank + 1, (len(images),), generator=generator))
    from torchvision.transforms import v2  # the audit's only use of torchvision: not imported before it is needed
    height, width = images.shape[-2:]
    out = []
    for image in images:
        if augmentation.crop_scale is not None:
            top, left, h, w = crop_box(height, width, augmentation.crop_scale, generator)
            image = v2.functional.resized_crop(image, top, left, h, w, [height, width], antialias=True)
        if (pad := augmentation.padding) is not None:  # RandomCrop(size, padding=pad): zeros, then a window
            top, left = (int(torch.randint(0, 2 * pad + 1, (1,), generator=generator)) for _ in range(2))
            image = torch.nn.functional.pad(image, (pad, pad, pad, pad))[:, top : top + height, left : left + width]
        if augmentation.flip and torch.rand((), generator=generator) < 0.5:
            image = image.flip(-1)
        out.append(image)
    return torch.stack(out) if out else images


def crop_box(height: int, width: int, scale: float, generator: torch.Generator) -> tuple[int, int, int, int]:
    """RandomResizedCrop's box (torchvision's sampling: up to 10 tries of an area share and a log-uniform aspect
    ratio, else the central crop at the clamped ratio), drawn from ``generator``."""
    area = height * width
    log_ratio = torch.log(torch.tensor(RATIO))
    for _ in range(10):
        target = area * torch.empty(1).uniform_(scale, 1.0, generator=generator).item()
        ratio = torch.exp(torch.empty(1).uniform_(float(log_ratio[0]), float(log_ratio[1]), generator=generator)).item()
        w, h = round((target * ratio) ** 0.5), round((target / ratio) ** 0.5)
        if 0 < w <= width and 0 < h <= height:
            top = int(torch.randint(0, height - h + 1, (1,), generator=generator))
            left = int(torch.randint(0, width - w + 1, (1,), generator=generator))
            return top, left, h, w
    ratio = width / height
    w, h = (width, round(width / RATIO[0])) if ratio < RATIO[0] else (
        (round(height * RATIO[1]), height) if ratio > RATIO[1] else (width, height))  # fmt: skip
    return (height - h) // 2, (width - w) // 2, h, w


def banked(inputs: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Inputs [n, D, 1 + K, 1] that hold, per image, its plain head input in slot 0 and K views' in slots 1..K (a
    frozen backbone's outputs: :func:`fedvit.attacks.frozen_features.on_features`): each image's view ``slots[i]``,
    as [n, D, 1, 1]."""
    return inputs[torch.arange(len(inputs)), :, slots, :].unsqueeze(2)
