"""A head fine-tuned on a frozen backbone, audited on the head alone: the backbone's outputs computed once.

When a partial update trains one submodule that maps the model's last hidden features to its output (Flower's ViT
example federates ``heads`` of a torchvision ViT-B/16), every image's input to that head depends only on the
public frozen weights. :func:`on_features` computes those inputs once, for the auxiliary images and the membership
candidates, and returns an observation whose model is the head alone (its parameters keep their full names) with
the features in place of the images: every simulation, shadow update and score then runs the head only. It is
exact where the backbone is deterministic and does not depend on the batch; a backbone with BatchNorm, dropout or
stochastic depth is refused (said, and the audit runs the whole model).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedvit.attacks.holdings import Auxiliary, Candidates
from fedvit.attacks.label_distribution import integer_counts
from fedvit.attacks.simulation import COSINE_FLOOR, COSINE_SPREAD, OTHER_DRAW, SCALE_MARGIN, cosine_of, simulate
from fedvit.core.model import normalize
from fedvit.observed.augmentation import Augmentation, augmented
from fedvit.observed.model_spec import ModelSpec
from fedvit.observed.observation import Observation, input_shape, public_model, received_model, recipe
from fedvit.observed.recipe import ClientRecipe

BATCH = 64  # images per forward pass of the backbone
NOISE_BANK = 64  # uniform-noise images whose features stand in for a class the auxiliary images lack
MIN_BANK = 2  # views per image in the bank under a declared augmentation, at least (one per local epoch)
MAX_BANK = 8  # the bank doubles up to this many views while its halves' spread is beyond the fit's margin
BANK_SEED = 0


class HeadOnly(nn.Module):
    """The trained head alone, at its path in the full model (``heads.head.weight`` keeps its name); its input is
    the backbone's output for one image, flattened to [D, S, 1] (an "image" of D channels, normalised by the
    identity; S slots: the image's own in slot 0, its banked views after it), of which slot 0 is reshaped to what the
    head takes (a view drawn from the bank arrives in slot 0: :func:`~fedvit.observed.augmentation.banked`)."""

    def __init__(self, path: str, head: nn.Module, feature_shape: tuple[int, ...]) -> None:
        super().__init__()
        *parents, leaf = path.split(".")
        host: nn.Module = self
        for part in parents:
            host.add_module(part, nn.Module())
            host = getattr(host, part)
        host.add_module(leaf, head)
        self.path, self.feature_shape = path, feature_shape
        width = int(np.prod(feature_shape))
        self.pretrained_cfg = {"mean": (0.0,) * width, "std": (1.0,) * width}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.get_submodule(self.path)(x[:, :, 0].reshape(len(x), *self.feature_shape))


def head_path(obs: Observation) -> str | None:
    """The module that owns every trained parameter (``heads.head``), None for a whole-model update or one spread
    over the model's root."""
    if obs.trained is None:
        return None
    parts = [name.split(".")[:-1] for name in obs.trained]
    common = os.path.commonprefix(parts)
    return ".".join(common) or None


def why_not_cached(obs: Observation) -> str | None:
    """Why the head's inputs cannot be computed once for ``obs`` (None: they can; under a declared augmentation, as
    a bank of views per image)."""
    path = head_path(obs)
    if path is None:
        return "the update is not a partial update of one submodule"
    for name, module in public_model(obs).named_modules():
        if name == path or name.startswith(f"{path}."):
            continue
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            return f"the frozen {name} is BatchNorm: its output depends on the batch"
        dropout = isinstance(module, nn.modules.dropout._DropoutNd) and module.p > 0
        if dropout or getattr(module, "drop_prob", 0):  # dropout, or timm's stochastic depth (DropPath)
            return f"the frozen {name} drops activations at random while the client trains"
    return None


def bank_size(obs: Observation) -> int:
    """Views per image in the bank under the client's declared augmentation (0: none declared): one per local epoch,
    at least :data:`MIN_BANK` (so that the bank splits into two halves whose spread is measured)."""
    return 0 if recipe(obs).augment is None else max(MIN_BANK, recipe(obs).epochs)


@torch.no_grad()
def head_inputs(model: nn.Module, path: str, images: np.ndarray, augmentation: Augmentation | None = None,
                views: int = 0) -> tuple[np.ndarray, np.ndarray, tuple[int, ...]]:  # fmt: skip
    """Per image, the input of ``model``'s submodule ``path`` flattened, [n, D, 1 + views]: slot 0 the image's, slot
    v its v-th random view's under ``augmentation`` (drawn from a generator seeded with :data:`BANK_SEED` + v); the
    model's log-softmax on the images (to check that the head alone gives the model's output); and the shape of one
    input of the head before flattening."""
    seen: list[torch.Tensor] = []
    hook = model.get_submodule(path).register_forward_hook(lambda m, i, o: seen.append(i[0].detach()))
    draws = [torch.Generator().manual_seed(BANK_SEED + v) for v in range(1, views + 1)]
    slots, outputs = [], []
    try:
        for first in range(0, len(images), BATCH):
            x = torch.as_tensor(images[first : first + BATCH], dtype=torch.float32)
            found = []
            for k, view in enumerate([x] + [augmented(x, augmentation, draw) for draw in draws]):
                seen.clear()
                out = model(normalize(model, view))
                if len(seen) != 1:
                    raise ValueError(f"{path} ran {len(seen)} times in one forward pass (not once)")
                found.append(seen[0].flatten(1))
                if k == 0:
                    outputs.append(F.log_softmax(getattr(out, "logits", out).float(), 1))
            slots.append(torch.stack(found, 2))
            shape = tuple(seen[0].shape[1:])
    finally:
        hook.remove()
    return torch.cat(slots).numpy(), torch.cat(outputs).numpy(), shape


@dataclasses.dataclass(frozen=True)
class HeadView:
    """The update seen on its head alone: the observation with the head as its model, the auxiliary images and
    candidates as the head's inputs, and under a declared augmentation the bank's measured spread."""

    obs: Observation
    aux: Auxiliary
    candidates: Candidates | None
    spread: BankSpread | None = None


def on_features(obs: Observation, aux: Auxiliary, candidates: Candidates | None) -> HeadView | str:
    """:class:`HeadView` of ``obs``: the head's inputs computed once with the received weights (the backbone's are
    the public frozen ones), or why not. Under a declared augmentation every image gets a bank of views, of
    :func:`bank_size` first, doubled (up to :data:`MAX_BANK`) while its two halves' spread is beyond the fit's
    margin (:func:`bank_spread`)."""
    if (why := why_not_cached(obs)) is not None:
        return why
    views = bank_size(obs)
    while True:
        found = head_view(obs, aux, candidates, views)
        if isinstance(found, str) or not views:
            return found
        spread = bank_spread(found.obs, found.aux)
        if spread.within or views * 2 > MAX_BANK:
            return dataclasses.replace(found, spread=spread)
        views *= 2


def head_view(obs: Observation, aux: Auxiliary, candidates: Candidates | None, views: int) -> HeadView | str:
    """:class:`HeadView` with ``views`` banked views per image (0: the images only), or why the head alone does not
    give the model's output."""
    path = head_path(obs)
    model = received_model(obs).float().eval()
    head = copy.deepcopy(model.get_submodule(path))
    client = recipe(obs)
    lacking = set(range(obs.num_classes)) - set(np.unique(aux.labels).tolist())
    noise = np.random.default_rng(0).random((NOISE_BANK if lacking else 0, *input_shape(obs)), dtype=np.float32)
    sets = [aux.images, noise] + ([candidates.members[0], candidates.non_members[0]] if candidates else [])
    parts: list[np.ndarray | None] = []
    computed: dict[int, np.ndarray] = {}  # by the array's identity: the non-members are often the auxiliary images
    for images in sets:  # one set at a time: the images of all of them may not fit in memory at once
        # uniform noise has no views: its own features fill every slot (a crop of noise is only more noise)
        banked = 0 if images is noise else views
        if id(images) in computed:
            parts.append(computed[id(images)])
            continue
        if len(images) == 0:
            parts.append(None)
            continue
        try:
            features, log_probs, head_shape = head_inputs(model, path, images, client.augment, banked)
        except ValueError as err:
            return str(err)
        with torch.no_grad():
            plain = torch.as_tensor(features[:, :, 0]).reshape(len(features), *head_shape)
            alone = F.log_softmax(head(plain).float(), 1).numpy()
        if not np.allclose(alone, log_probs, atol=1e-4):
            return f"the model does more after {path} than the head (its output differs from the head's alone)"
        features = features[:, :, [0] * (1 + views)] if banked != views else features
        computed[id(images)] = features[..., None]  # [n, D, 1 + views, 1]: "images" of D channels
        parts.append(computed[id(images)])
    width, slots = next(p for p in parts if p is not None).shape[1:3]
    parts = [np.zeros((0, width, slots, 1), np.float32) if p is None else p for p in parts]
    spec = ModelSpec(
        factory=f"{obs.spec.factory}: {path} alone on the frozen backbone's features",
        input_shape=(width, slots, 1),
        mean=(0.0,) * width,
        std=(1.0,) * width,
        loss=obs.spec.loss,
        builder=lambda: HeadOnly(path, copy.deepcopy(head), head_shape),
    )
    head_obs = dataclasses.replace(obs, spec=spec, skeleton=spec.build(), client=on_bank(client, views))
    head_aux = dataclasses.replace(aux, images=parts[0], noise=parts[1])
    if candidates is None:
        return HeadView(head_obs, head_aux, None)
    head_candidates = dataclasses.replace(candidates, members=(parts[2], candidates.members[1]),
                                          non_members=(parts[3], candidates.non_members[1]))  # fmt: skip
    return HeadView(head_obs, head_aux, head_candidates)


def on_bank(client: ClientRecipe, views: int) -> ClientRecipe:
    """``client``'s recipe for the head on banked inputs: its declared augmentation drawn from the bank's ``views``
    (unchanged where it declares none)."""
    if client.augment is None or client.augment.bank:
        return client
    return dataclasses.replace(client, augment=dataclasses.replace(client.augment, bank=views))


@dataclasses.dataclass(frozen=True)
class BankSpread:
    """How much the bank's finite draw of views moves a simulation: the simulated head change on the bank's two
    halves (odd and even slots; the same images, order and slot draws) compared, against the fit's direction margin
    measured the same way (the first half on another draw of images and order: the spread two simulations of the
    recipe have anyway, :class:`~fedvit.attacks.simulation.RecipeFit`)."""

    views: int
    cosine: float  # between the halves
    scale: float  # norm ratio of the halves' head changes
    own_cosine: float  # the first half against itself on another draw

    @property
    def margin(self) -> float:
        """1 − the lowest cosine the recipe fit accepts at this own spread."""
        return COSINE_SPREAD * (1 - self.own_cosine) + COSINE_FLOOR

    @property
    def within(self) -> bool:
        scale_ok = abs(math.log(max(self.scale, 1e-12))) <= math.log(SCALE_MARGIN)
        return bool(1 - self.cosine <= self.margin and scale_ok)

    def described(self) -> str:
        verdict = "within" if self.within else "beyond"
        return (f"a bank of {self.views} random views per image (the client's augmentation, seeded); its two halves' "
                f"simulated head changes agree to cosine {self.cosine:.3f}, norm ×{self.scale:.2f}: {verdict} the "
                f"fit's margin (1 − cosine ≤ {self.margin:.3f}, from two draws at {self.own_cosine:.3f}; norm within "
                f"×{SCALE_MARGIN:g})")  # fmt: skip


def bank_spread(obs: Observation, aux: Auxiliary, seed: int = 0) -> BankSpread:
    """:class:`BankSpread` of the head observation ``obs`` on banked auxiliary inputs ``aux``, at the auxiliary
    data's class shares of the client's images."""
    client = recipe(obs)
    views = client.augment.bank
    counts = integer_counts(client.examples * aux.prior(obs.num_classes), client.examples)
    halves = [[0, *range(first, views + 1, 2)] for first in (1, 2)]

    def run(slots: list[int], draw: int) -> np.ndarray:
        half = dataclasses.replace(aux, images=aux.images[:, :, slots],
                                   noise=None if aux.noise is None else aux.noise[:, :, slots])  # fmt: skip
        bank = dataclasses.replace(client, augment=dataclasses.replace(client.augment, bank=len(slots) - 1))
        return simulate(dataclasses.replace(obs, client=bank), half, counts, client.momentum, draw).head_delta

    a, b, other = run(halves[0], seed), run(halves[1], seed), run(halves[0], seed + OTHER_DRAW)
    return BankSpread(views, cosine_of(a, b), float(np.linalg.norm(a) / max(np.linalg.norm(b), 1e-300)),
                      cosine_of(a, other))  # fmt: skip
