"""What an attacker holds: one captured client update, the global model that client received, public config.

The attacker boundary lives here: an :class:`Observation` has no field for the client's data, and every attack
takes an Observation and returns a :class:`Reconstruction`. Ground truth goes only to ``attacks.metrics``.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
from dataclasses import dataclass, field

import numpy as np
from torch import nn

from attacks.model_spec import fedvit_model_spec
from core.config import Config
from core.masks import decode
from core.model import set_weights


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
    # SCAFFOLD: c − c_i, added to every local gradient; c is in the train message, c_i the sum of the client's
    # earlier control-deltas on the wire (zeros before its first round)
    correction: dict[str, np.ndarray] | None = None
    meta: dict = field(default_factory=dict)  # node, round, ... (for reports only)


@dataclass(frozen=True)
class Reconstruction:
    """An attack's output: an image [C, H, W] in [0, 1], or None with the reason it could not run.

    Batch attacks also return every image they reconstructed in ``images`` (``image`` is then the first);
    optimisation attacks say how many optimiser steps they took in ``steps`` (fewer than asked under a time cap).
    """

    image: np.ndarray | None
    note: str = ""
    images: tuple[np.ndarray, ...] = ()
    steps: int | None = None

    @property
    def all_images(self) -> list[np.ndarray]:
        """Every reconstructed image (one for single-image attacks, none when the attack could not run)."""
        if self.images:
            return list(self.images)
        return [] if self.image is None else [self.image]


@functools.lru_cache(maxsize=4)
def model_skeleton(config: Config, num_classes: int) -> nn.Module:
    """The model architecture of a public run config (cached; its weights are not what a client received)."""
    return fedvit_model_spec(config, num_classes).build()


def public_model(obs: Observation) -> nn.Module:
    """The model architecture from the public config (weights are not used; take them from ``obs.received``)."""
    return model_skeleton(obs.config, obs.num_classes)


def received_model(obs: Observation) -> nn.Module:
    """A private copy of the model with the weights the client received (the cached skeleton stays untouched)."""
    model = copy.deepcopy(public_model(obs))
    set_weights(model, obs.received)
    return model


GRADIENT_STRATEGIES = ("fedsgd", "masked-fedsgd")  # replies carry the gradient of one batch
WEIGHT_STRATEGIES = ("fedavg", "fedprox", "fedwavg", "scaffold")  # replies carry the new weights, not a gradient


@dataclass(frozen=True)
class ClientRecipe:
    """The client's local work as the attacker assumes it from the public run config and the reply's metadata."""

    examples: int  # distinct images the client trained on (the reply's num-examples)
    batch: int  # images per local step
    epochs: int  # passes over them (FedAvg local epochs; 1 for FedSGD)
    lr: float  # the client's learning rate (FedAvg/FedProx)
    momentum: float  # its SGD momentum
    proximal_mu: float  # FedProx μ (0 otherwise)
    adversarial: int  # samples per step replaced by their PGD versions (Madry AT), 0 if off
    sends_gradient: bool  # FedSGD: the update is the gradient; FedAvg: the update is the new weights

    @property
    def steps(self) -> int:
        """Local optimiser steps: ⌈examples / batch⌉ per epoch."""
        return self.epochs * math.ceil(self.examples / self.batch)


def recipe(obs: Observation) -> ClientRecipe:
    """The client's recipe from the public config and the reply's ``num-examples`` (else the batch size): the
    learning rate of the captured round after decay; FedSGD is one step on all its examples."""
    config = obs.config
    examples = int(obs.meta.get("num-examples") or config.batch_size)
    sends_gradient = config.strategy in GRADIENT_STRATEGIES
    batch = examples if sends_gradient else min(config.batch_size, examples)
    epochs = 1 if sends_gradient else config.local_epochs
    adversarial = int(np.floor(config.adversarial.ratio * batch)) if config.adversarial.enabled else 0
    mu = config.fedprox.mu if config.strategy == "fedprox" else 0.0
    lr = config.lr_at(int(obs.meta.get("round") or 1))
    return ClientRecipe(examples, batch, epochs, lr, config.momentum, mu, adversarial, sends_gradient)


def as_gradient(obs: Observation) -> Observation:
    """A FedAvg-type update read as a gradient: w_received − w_sent = lr · Σ_t g_t (plain SGD), the summed
    gradient of every local step up to the learning rate, which the scale-free closed forms ignore."""
    if obs.config.strategy not in WEIGHT_STRATEGIES:
        return obs
    delta = {n: obs.received[n] - u for n, u in obs.update.items()}
    return dataclasses.replace(obs, update=delta)


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
