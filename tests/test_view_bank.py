"""A head fine-tuned on a frozen backbone under random crops: the backbone runs once per image and view (a bank of
the client's own augmentation, seeded), every simulation and loss score draws from the bank, and the recipe fit
still tells the right recipe from wrong ones."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from fedvit.attacks import label_distribution
from fedvit.attacks.frozen_features import BANK_SEED, HeadView, on_features
from fedvit.attacks.holdings import Auxiliary, Candidates
from fedvit.attacks.membership import losses
from fedvit.core.model import normalize
from fedvit.observed.augmentation import augmented, banked, parse
from fedvit.observed.model_spec import ModelSpec
from fedvit.observed.observation import Observation
from fedvit.observed.recipe import ClientRecipe

sys.path.insert(0, str(Path(__file__).parent / "headapp"))
from vithead.task import MEAN, STD, as_tensors, get_model, load_pixels, train  # noqa: E402

AUGMENT = "crop:0.5+flip"  # the head app's RandomResizedCrop(32, scale=(0.5, 1.0)) and flip
SPEC = ModelSpec("vithead.task:get_model", mean=MEAN, std=STD, builder=lambda: get_model(10))


@pytest.fixture(scope="module")
def head_update() -> tuple[Observation, Auxiliary, Candidates]:
    """Partition 0's 64 images trained as the head app trains them (Adam lr 0.001, crops and flips, batch 16); the
    other client's 80 images as auxiliary data and non-members (one array: the audit's own case)."""
    model = SPEC.build()
    received = {n: t.detach().numpy().copy() for n, t in model.state_dict().items()}
    images, labels = as_tensors(*load_pixels(0, 64, 7))
    train(model, images, labels, torch.optim.Adam(model.heads.parameters(), lr=0.001), 1, 16, seed=1)
    sent = {n: t.detach().numpy().copy() for n, t in model.state_dict().items()}
    client = ClientRecipe(64, 16, 1, 0.001, 0.0, 0.0, 0, False, True, optimiser="adam", augment=parse(AUGMENT))
    obs = Observation(update=sent, received=received, num_classes=10, spec=SPEC, skeleton=SPEC.build(),
                      client=client, head_bias="heads.head.bias", trained=("heads.head.weight", "heads.head.bias"))
    others, other_labels = (t.numpy() for t in as_tensors(*load_pixels(3, 80, 7)))
    aux = Auxiliary(others, other_labels, "partition 3")
    return obs, aux, Candidates((images.numpy(), labels.numpy()), (aux.images, aux.labels), "partition 3")


@pytest.fixture(scope="module")
def view(head_update) -> HeadView:
    found = on_features(*head_update)
    assert isinstance(found, HeadView), found
    return found


def test_the_bank_holds_each_images_head_input_and_its_seeded_views(head_update, view):
    obs, aux, _ = head_update
    assert view.obs.client.augment.bank == view.spread.views == 2
    assert view.obs.spec.input_shape == (48, 3, 1)  # D channels; slot 0 the image's own, then its 2 views
    model = SPEC.build().eval()  # the spec's mean and std attached, as the audit builds it
    seen = []
    model.heads.register_forward_hook(lambda m, i, o: seen.append(i[0]))
    x = torch.as_tensor(aux.images, dtype=torch.float32)
    with torch.no_grad():
        for slot in range(3):
            draw = torch.Generator().manual_seed(BANK_SEED + slot)
            shown = x if slot == 0 else augmented(x, obs.client.augment, draw)
            model(normalize(model, shown))
            np.testing.assert_allclose(view.aux.images[:, :, slot, 0], seen[-1].numpy(), rtol=1e-5, atol=1e-5)
    assert not np.allclose(view.aux.images[:, :, 1], view.aux.images[:, :, 2])  # two different views
    assert view.candidates.non_members[0] is view.aux.images  # the same images: computed once
    assert view.spread.within and "a bank of 2 random views per image" in view.spread.described()


def test_a_simulation_draws_a_view_of_the_bank_per_visit_and_the_loss_scores_average_every_view(view):
    inputs = torch.as_tensor(view.aux.images[:6])
    slots = torch.tensor([1, 2, 1, 2, 2, 1])
    drawn = banked(inputs, slots)
    assert drawn.shape == (6, 48, 1, 1)
    for i, slot in enumerate(slots):
        assert torch.equal(drawn[i, :, 0, 0], inputs[i, :, slot, 0])
    head = view.obs.spec.build()
    labels = view.aux.labels[:6]
    each = [losses(head, banked(inputs, torch.full((6,), s)).numpy(), labels) for s in (1, 2)]
    np.testing.assert_allclose(losses(head, inputs.numpy(), labels, view.obs.client.augment), np.mean(each, 0))
    assert not np.allclose(each[0], losses(head, inputs.numpy(), labels))  # the views are not the plain images


@pytest.mark.parametrize(("control", "fits"), [("right", True), ("wrong optimiser", False), ("10x lr", False)])
def test_on_the_bank_the_right_recipe_fits_and_wrong_ones_do_not(view, control, fits):
    client = view.obs.client
    told = {"right": client, "wrong optimiser": dataclasses.replace(client, optimiser="sgd", momentum=0.9),
            "10x lr": dataclasses.replace(client, lr=10 * client.lr)}[control]  # fmt: skip
    found = label_distribution.estimate(dataclasses.replace(view.obs, client=told), view.aux)
    assert found.fit is not None and found.fit.fits is fits, found.fit.described()
