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
import os

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedvit.attacks.holdings import Auxiliary, Candidates
from fedvit.attacks.model_spec import ModelSpec
from fedvit.attacks.observation import Observation, input_shape, public_model, received_model
from fedvit.core.model import normalize

BATCH = 64  # images per forward pass of the backbone
NOISE_BANK = 64  # uniform-noise images whose features stand in for a class the auxiliary images lack


class HeadOnly(nn.Module):
    """The trained head alone, at its path in the full model (``heads.head.weight`` keeps its name); its input is
    the backbone's output for one image, flattened to [D, 1, 1] (an "image" of D channels, normalised by the
    identity) and reshaped to what the head takes."""

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
        return self.get_submodule(self.path)(x.reshape(len(x), *self.feature_shape))


def head_path(obs: Observation) -> str | None:
    """The module that owns every trained parameter (``heads.head``), None for a whole-model update or one spread
    over the model's root."""
    if obs.trained is None:
        return None
    parts = [name.split(".")[:-1] for name in obs.trained]
    common = os.path.commonprefix(parts)
    return ".".join(common) or None


def why_not_cached(obs: Observation) -> str | None:
    """Why the head's inputs cannot be computed once for ``obs`` (None: they can)."""
    path = head_path(obs)
    if path is None:
        return "the update is not a partial update of one submodule"
    if obs.client.augment is not None:
        return "the client trains on random views (declared augmentation): the backbone's output differs per view"
    for name, module in public_model(obs).named_modules():
        if name == path or name.startswith(f"{path}."):
            continue
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            return f"the frozen {name} is BatchNorm: its output depends on the batch"
        dropout = isinstance(module, nn.modules.dropout._DropoutNd) and module.p > 0
        if dropout or getattr(module, "drop_prob", 0):  # dropout, or timm's stochastic depth (DropPath)
            return f"the frozen {name} drops activations at random while the client trains"
    return None


@torch.no_grad()
def head_inputs(model: nn.Module, path: str, images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per image, the input of ``model``'s submodule ``path`` flattened, and the model's log-softmax (to check that
    the head alone gives the model's output)."""
    seen: list[torch.Tensor] = []
    hook = model.get_submodule(path).register_forward_hook(lambda m, i, o: seen.append(i[0].detach()))
    features, outputs = [], []
    try:
        for first in range(0, len(images), BATCH):
            seen.clear()
            out = model(normalize(model, torch.as_tensor(images[first : first + BATCH], dtype=torch.float32)))
            if len(seen) != 1:
                raise ValueError(f"{path} ran {len(seen)} times in one forward pass (not once)")
            features.append(seen[0])
            outputs.append(F.log_softmax(getattr(out, "logits", out).float(), 1))
    finally:
        hook.remove()
    return torch.cat(features).numpy(), torch.cat(outputs).numpy()


def on_features(
    obs: Observation, aux: Auxiliary, candidates: Candidates | None
) -> tuple[Observation, Auxiliary, Candidates | None] | str:
    """The observation with the head as its model and the auxiliary images and candidates as the head's inputs
    (computed once with the received weights: the backbone's are the public frozen ones), or why not."""
    if (why := why_not_cached(obs)) is not None:
        return why
    path = head_path(obs)
    model = received_model(obs).float().eval()
    head = copy.deepcopy(model.get_submodule(path))
    noise = np.random.default_rng(0).random((NOISE_BANK, *input_shape(obs)), dtype=np.float32)
    sets = [aux.images, noise] + ([candidates.members[0], candidates.non_members[0]] if candidates else [])
    parts = []
    for images in sets:  # one set at a time: the images of all of them may not fit in memory at once
        if len(images) == 0:
            parts.append(np.zeros((0, *parts[0].shape[1:]), np.float32))
            continue
        try:
            features, log_probs = head_inputs(model, path, images)
        except ValueError as err:
            return str(err)
        with torch.no_grad():
            alone = F.log_softmax(head(torch.as_tensor(features)).float(), 1).numpy()
        if not np.allclose(alone, log_probs, atol=1e-4):
            return f"the model does more after {path} than the head (its output differs from the head's alone)"
        parts.append(features.reshape(len(features), -1, 1, 1))
    shape, width = features.shape[1:], parts[0].shape[1]
    spec = ModelSpec(
        factory=f"{obs.spec.factory}: {path} alone on the frozen backbone's features",
        input_shape=(width, 1, 1),
        mean=(0.0,) * width,
        std=(1.0,) * width,
        loss=obs.spec.loss,
        builder=lambda: HeadOnly(path, copy.deepcopy(head), shape),
    )
    head_obs = dataclasses.replace(obs, spec=spec, skeleton=spec.build())
    head_aux = dataclasses.replace(aux, images=parts[0], noise=parts[1])
    if candidates is None:
        return head_obs, head_aux, None
    head_candidates = dataclasses.replace(candidates, members=(parts[2], candidates.members[1]),
                                          non_members=(parts[3], candidates.non_members[1]))  # fmt: skip
    return head_obs, head_aux, head_candidates
