"""The declared augmentation: its names, its random views (torchvision's RandomResizedCrop sampling), its use in
the loss scores and the simulations."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedvit.attacks.membership import losses
from fedvit.observed.augmentation import Augmentation, AugmentationError, augmented, crop_box, parse


def test_names_parse_to_crops_and_flips_and_anything_else_is_refused():
    assert parse("crop+flip") == Augmentation(0.08, True)
    assert parse(" Crop:0.5 ") == Augmentation(0.5, False)
    assert parse("flip") == Augmentation(None, True)
    assert parse("none") is None
    assert parse("crop:0.5+flip").describe() == "random resized crop (scale 0.5–1) + horizontal flip"
    with pytest.raises(AugmentationError, match="'rotate' is not modelled"):
        parse("crop+rotate")
    with pytest.raises(AugmentationError, match="crop's scale must be in"):
        parse("crop:1.5")


def test_crop_boxes_follow_random_resized_crop():
    """Inside the image, an area share within [scale, 1], an aspect ratio within 3/4–4/3 (up to rounding), and
    reproducible from the generator."""
    generator = torch.Generator().manual_seed(0)
    shares, ratios = [], []
    for _ in range(500):
        top, left, h, w = crop_box(32, 32, 0.3, generator)
        assert 0 <= top <= 32 - h and 0 <= left <= 32 - w
        shares.append(h * w / 1024)
        ratios.append(w / h)
    assert min(shares) >= 0.3 - 0.05 and max(shares) <= 1 and np.ptp(shares) > 0.5
    assert min(ratios) >= 0.75 - 0.1 and max(ratios) <= 4 / 3 + 0.1
    assert crop_box(32, 32, 0.3, torch.Generator().manual_seed(1)) == crop_box(
        32, 32, 0.3, torch.Generator().manual_seed(1)
    )


def test_views_flip_about_half_the_images_and_the_loss_is_their_mean():
    images = torch.rand(200, 3, 8, 8)
    flipped = augmented(images, Augmentation(None, True), torch.Generator().manual_seed(0))
    same = [torch.equal(a, b) for a, b in zip(images, flipped, strict=True)]
    mirrored = [torch.equal(a.flip(-1), b) for a, b in zip(images, flipped, strict=True)]
    assert all(s or m for s, m in zip(same, mirrored, strict=True)) and 60 < sum(mirrored) < 140

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(192, 3))
    labels = np.arange(200) % 3
    plain = losses(model, images.numpy(), labels)
    views = losses(model, images.numpy(), labels, Augmentation(0.5, True))
    assert views.shape == plain.shape and not np.allclose(views, plain)
    again = losses(model, images.numpy(), labels, Augmentation(0.5, True))
    np.testing.assert_array_equal(views, again)  # the same views for every model
