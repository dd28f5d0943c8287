"""What an attacker holds: one captured client update, the model that client received, what is public.

The attacker boundary: an :class:`Observation` has no field for the client's data; every attack takes one and
returns a :class:`Reconstruction`. Whatever app the update came from, it holds the attacked model (a
:class:`~fedvit.observed.model_spec.ModelSpec`), the client's recipe with the source of each value, the defence the
run names and what is public. The audit resolves them once, when it reads a capture (fedvit's own runs from their
run config: :mod:`fedvit.audit.fedvit_run`); the attacks never read a run configuration.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from fedvit.core.masks import decode
from fedvit.core.params import HEAD_BIAS, PATCH_EMBED_WEIGHT, POS_EMBED
from fedvit.observed.model_spec import ModelSpec
from fedvit.observed.recipe import SIMULATED_OPTIMISERS, ClientRecipe

GRADIENT_STRATEGIES = ("fedsgd", "masked-fedsgd")  # replies carry the gradient of one batch
WEIGHT_STRATEGIES = ("fedavg", "fedprox", "fedwavg", "scaffold")  # replies carry the new weights, not a gradient
NOT_FEDVIT = "as captured (not fedvit's app)"


@dataclass(frozen=True)
class Defence:
    """The defence a fedvit run switched on, as its public run config names it (never its keys): what the
    defence-aware attacks branch on. Another app's capture: none is known (``strategy`` "")."""

    name: str = NOT_FEDVIT  # a short public label ("none", "mask-fresh-r0.5", ...)
    strategy: str = ""  # fedvit's aggregation ("fedsgd", "masked-fedsgd", "fedavg", ...)
    mask_mode: str | None = None  # masked FedSGD's mask mode (the payload carries the masks)
    encryption: str = "off"  # the encrypted-domain aggregation's mode ("off", "paper", "private-init")
    dp: bool = False  # DP clipping scaled the update by a factor the attacker does not know

    @property
    def fedvit(self) -> bool:
        """Whether the update is of fedvit's own app (its run config named the defence)."""
        return bool(self.strategy)


@dataclass(frozen=True, eq=False)
class Observation:
    """One single-client update as seen on the wire, plus what is public.

    ``update``: the dense update by parameter name (a gradient, or the new weights), zeros where a mask dropped
    an entry. ``masks``: boolean keep-masks by name when the payload carried them (masked FedSGD), else None.
    ``received``: the model the client received (encrypted layers included, if any; buffers too for a user's
    model). ``known_plaintext``: plaintext initial embeddings the attacker knows (e.g. the server's own initial
    model in the encrypted-ViT paper's protocol), else None. ``spec`` (built once as ``skeleton``) is the attacked
    model, ``client`` the recipe, ``defence`` what the run switched on, ``seed`` the attacker's own randomness
    (fedvit's runs: their run seed) and ``test_split`` the run's public test split, loaded on demand.
    """

    update: dict[str, np.ndarray]
    received: dict[str, np.ndarray]
    num_classes: int
    spec: ModelSpec
    skeleton: nn.Module = field(repr=False)
    client: ClientRecipe
    masks: dict[str, np.ndarray] | None = None
    known_plaintext: dict[str, np.ndarray] | None = None
    known_ciphertext: dict[str, np.ndarray] | None = None  # the same layers as the server adopted them
    # images the attacker knows (e.g. a colluding client's) with their updates under the same defence
    known_images: list[tuple[np.ndarray, dict[str, np.ndarray]]] | None = None
    # SCAFFOLD: c − c_i, added to every local gradient; c is in the train message, c_i the sum of the client's
    # earlier control-deltas on the wire (zeros before its first round)
    correction: dict[str, np.ndarray] | None = None
    meta: dict = field(default_factory=dict)  # node, round, ... (for reports only)
    defence: Defence = Defence()
    seed: int = 0
    test_split: Callable[[], Any] | None = field(default=None, repr=False)  # a dataset with .labels and .batch
    head_bias: str = HEAD_BIAS  # the classifier bias, whose gradient gives the labels away
    start_seed: int | None = None  # another app's update: one generator for all random starts (None: fedvit's)
    # a partial update (a head fine-tuned on a frozen backbone): the parameters the client sent and trained, the
    # rest public (the user's --model weights); None: the whole model
    trained: tuple[str, ...] | None = None


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


# ---------------------------------------------------------------------------- the model


def public_model(obs: Observation) -> nn.Module:
    """The model architecture (weights are not used; take them from ``obs.received``)."""
    return obs.skeleton


def _load(model: nn.Module, obs: Observation, weights: dict[str, np.ndarray]) -> None:
    """The model's state dict, as far as ``weights`` carries it (fedvit's: every parameter by name)."""
    model.load_state_dict({n: torch.as_tensor(np.array(w)) for n, w in weights.items()}, strict=False)


def received_model(obs: Observation) -> nn.Module:
    """A private copy of the model with the weights the client received (the cached skeleton stays untouched)."""
    model = copy.deepcopy(public_model(obs))
    _load(model, obs, obs.received)
    return model


def model_with(obs: Observation, weights: dict[str, np.ndarray]) -> nn.Module:
    """The received model with ``weights`` laid over it (e.g. the sent weights: buffers they lack stay as
    received)."""
    model = received_model(obs)
    _load(model, obs, weights)
    return model


def attack_model(obs: Observation) -> nn.Module:
    """The received model set up for the attacks: float32, eval mode (no dropout noise) but BatchNorm on batch
    statistics, as the client's training forward used them (running statistics are not tracked, so a simulated
    step writes no buffers); timm's fused attention switched to the explicit path (double backward is not
    implemented on CPU); an output object with ``.logits`` (Hugging Face) read as its logits."""
    model = received_model(obs).float().eval()
    for module in model.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            module.track_running_stats = False
            module.running_mean = module.running_var = None
    explicit_attention(model)
    for p in model.parameters():
        p.requires_grad_(False)
    model.register_forward_hook(_logits_only)
    return model


def _logits_only(module: nn.Module, inputs: Any, output: Any) -> Any:
    """Hugging Face models return an output object; the attacks need the logits tensor."""
    return output.logits if hasattr(output, "logits") else output


def input_shape(obs: Observation) -> tuple[int, int, int]:
    """(C, H, W) of the images the client feeds the model."""
    return tuple(obs.spec.input_shape)


def image_geometry(obs: Observation) -> tuple[int, int, int, int]:
    """(C, H, W, P) of the model's input; P is the patch size of a ViT's patch embedding (0 for other models)."""
    c, h, w = input_shape(obs)
    embed = getattr(public_model(obs), "patch_embed", None)
    patch = int(embed.proj.kernel_size[0]) if embed is not None and hasattr(embed, "proj") else 0
    return c, h, w, patch


def normalization(obs: Observation) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel mean and std the model applies to [0, 1] pixels (fedvit.core.model.normalize)."""
    cfg = getattr(public_model(obs), "pretrained_cfg", {}) or {}
    return np.asarray(cfg.get("mean", (0.5,) * 3)), np.asarray(cfg.get("std", (0.5,) * 3))


def trained_names(obs: Observation) -> list[str]:
    """The parameters the client trained, in the model's order: those a partial update covers, else all."""
    names = [n for n, _ in public_model(obs).named_parameters()]
    return names if obs.trained is None else [n for n in names if n in obs.trained]


def partial_update(obs: Observation) -> str | None:
    """Why an image attack does not apply to a partial update (None for a whole-model update)."""
    if obs.trained is None:
        return None
    return (
        f"the update covers only {len(obs.trained)} parameter tensor(s) (the rest frozen at the public weights): "
        "images would have to be inverted from the trained part's inputs, through the frozen layers (feature "
        "inversion), which fedvit does not attempt"
    )


def has_vit_embeddings(obs: Observation) -> str | None:
    """Why the ViT closed forms do not apply (None when the update has a patch and a position embedding)."""
    if (why := partial_update(obs)) is not None:
        return why
    if POS_EMBED in obs.update and PATCH_EMBED_WEIGHT in obs.update:
        return None
    return "no patch embedding and position embedding (APRIL's closed forms need a ViT's)"


def attacker_seed(obs: Observation) -> int:
    """The seed of the attacker's own randomness: fedvit's run seed, else 0."""
    return obs.seed


def first_block(obs: Observation) -> str:
    """fedvit's ``model.first-block`` ("pre-ln" for every model not built by fedvit: timm's block)."""
    return obs.spec.first_block


# ---------------------------------------------------------------------------- the client's recipe


def recipe(obs: Observation) -> ClientRecipe:
    """The client's recipe (resolved once, when the observation was made)."""
    return obs.client


def simulated(obs: Observation) -> str | None:
    """Why the client's local work cannot be simulated (None when it can)."""
    strategy = obs.defence.strategy
    if strategy and strategy not in GRADIENT_STRATEGIES + WEIGHT_STRATEGIES:
        return f"strategy {strategy!r} is not modelled by the attacks"
    return None


def other_optimiser(obs: Observation) -> str | None:
    """Why a simulation of local training does not model this client (None when it does): a record names an
    optimiser the simulations do not implement (they run SGD with momentum, Adam and AdamW)."""
    name = recipe(obs).optimiser
    if name is None or name in SIMULATED_OPTIMISERS:
        return None
    return f"the client's optimiser is {recipe(obs).source_of('optimiser') or name}; fedvit simulates SGD, Adam, AdamW"


def not_plain_sgd(obs: Observation) -> str | None:
    """Why the label counts' relation (the head's change is lr times a weighted sum of its gradients: SGD's update)
    does not hold for this client (None when it does): another optimiser, DP-SGD, or an update clipped to a norm."""
    client = recipe(obs)
    if client.optimiser not in (None, "sgd"):
        return f"the client's optimiser is {client.optimiser}, which rescales every entry of its update"
    if (claim := client.privacy) is not None and claim.noise_multiplier:
        return "the client claims DP-SGD: each image's gradient is clipped and noise is added to every step"
    if client.update_noise is not None:
        return f"Flower's LocalDpMod added Gaussian noise of std {client.update_noise:.3g} to every entry of the update"
    if update_clipped(obs):
        return f"the update was clipped to norm {client.update_clip:g}: its scale is unknown"
    return None


def update_clipped(obs: Observation) -> bool:
    """Whether Flower's client-side clipping bounds this update and its norm is at the bound (it was scaled)."""
    bound = recipe(obs).update_clip
    return bound is not None and update_norm(obs) >= bound * (1 - 1e-4)


def update_norm(obs: Observation) -> float:
    """‖w_sent − w_received‖ over the trained arrays (the norm Flower's client-side clipping bounds)."""
    return float(np.sqrt(sum(float(np.sum((np.asarray(obs.update[n], np.float64) - obs.received[n]) ** 2))
                             for n in trained_names(obs) if n in obs.update)))  # fmt: skip


def as_gradient(obs: Observation) -> Observation:
    """A weights update read as a gradient: w_received − w_sent = lr · Σ_t g_t (plain SGD), the summed gradient
    of every local step up to the learning rate, which the scale-free closed forms ignore."""
    if recipe(obs).sends_gradient:
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


def explicit_attention(model: nn.Module) -> nn.Module:
    """``model`` with timm's fused attention switched to its explicit path, in place: ``scaled_dot_product_attention``
    has no double backward on CPU and no batching rule for ``torch.func.vmap``; returns ``model``."""
    for module in model.modules():
        if hasattr(module, "fused_attn"):
            module.fused_attn = False
    return model
