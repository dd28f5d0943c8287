"""What an attacker holds: one captured client update, the global model that client received, public config.

The attacker boundary lives here: an :class:`Observation` has no field for the client's data, and every attack
takes an Observation and returns a :class:`Reconstruction`. Ground truth goes only to ``attacks.metrics``.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field

import numpy as np
from torch import nn

from core.config import Config
from core.masks import decode
from core.model import build_model


@dataclass(frozen=True, eq=False)
class Observation:
    """One single-client update as seen on the wire, plus what is public.

    ``update``: the dense update (FedSGD gradient) by parameter name, zeros where a mask dropped an entry.
    ``masks``: boolean keep-masks by name when the payload carried them (masked FedSGD), else None.
    ``received``: the global model the client received (encrypted layers included, if any).
    ``known_plaintext``: plaintext initial embeddings the attacker knows (e.g. a public checkpoint, or the
    server's own initial model in the encrypted-ViT paper's protocol), else None.
    """

    update: dict[str, np.ndarray]
    received: dict[str, np.ndarray]
    config: Config  # the public run config (model shape, strategy, defence settings; never keys)
    num_classes: int
    masks: dict[str, np.ndarray] | None = None
    known_plaintext: dict[str, np.ndarray] | None = None
    known_ciphertext: dict[str, np.ndarray] | None = None  # the same layers as the server adopted them
    # images the attacker knows (e.g. a colluding client's) with their updates under the same defence
    known_images: list[tuple[np.ndarray, dict[str, np.ndarray]]] | None = None
    meta: dict = field(default_factory=dict)  # node, round, ... (for reports only)


@dataclass(frozen=True)
class Reconstruction:
    """An attack's output: an image [C, H, W] in [0, 1], or None with the reason it could not run."""

    image: np.ndarray | None
    note: str = ""


@functools.lru_cache(maxsize=4)
def model_skeleton(config: Config, num_classes: int) -> nn.Module:
    """The model architecture of a public run config (cached; its weights are not what a client received)."""
    return build_model(dataclasses.replace(config.model, pretrained="off"), num_classes, config.seed)


def public_model(obs: Observation) -> nn.Module:
    """The model architecture from the public config (weights are not used; take them from ``obs.received``)."""
    return model_skeleton(obs.config, obs.num_classes)


def dense_update(
    records: dict[str, dict[str, np.ndarray]], shapes: dict[str, tuple[int, ...]]
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray] | None]:
    """A train reply's records as the attacker reads them: the dense update, and the masks when it carried any."""
    if "masks" not in records:
        return records["arrays"], None
    dense = {n: decode(records["arrays"][n], records["masks"][n], shape) for n, shape in shapes.items()}
    return {n: d[0] for n, d in dense.items()}, {n: d[1] for n, d in dense.items()}


def image_geometry(obs: Observation) -> tuple[int, int, int, int]:
    """(C, H, W, P) of the model's input."""
    model = public_model(obs)
    proj = model.patch_embed.proj
    h, w = model.patch_embed.img_size
    return int(proj.in_channels), int(h), int(w), int(proj.kernel_size[0])


def normalization(obs: Observation) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel mean and std the model applies to [0, 1] pixels (core.model.normalize)."""
    cfg = getattr(public_model(obs), "pretrained_cfg", {}) or {}
    return np.asarray(cfg.get("mean", (0.5,) * 3)), np.asarray(cfg.get("std", (0.5,) * 3))
