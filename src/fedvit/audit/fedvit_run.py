"""fedvit's own runs as an attacker holds them. A run's public run config (model, strategy, defence, recipe; never
keys) becomes, once per capture, the typed inputs every attack takes: the model spec, the recipe, the defence and
the run seed. The recipe is read by the same code as any app's (:func:`fedvit.observed.recipe.read_recipe`) from
what the run config states. The attacks never see the config itself: an import contract keeps them off it."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np
from torch import nn

from fedvit.clients.adversarial import attack_from
from fedvit.clients.privacy import local_epsilon
from fedvit.core.config import Config, defence_of
from fedvit.observed.model_spec import ModelSpec
from fedvit.observed.observation import GRADIENT_STRATEGIES, Defence, Observation
from fedvit.observed.recipe import ClientRecipe, Records, read_recipe


@functools.lru_cache(maxsize=4)
def fedvit_spec(config: Config, num_classes: int) -> ModelSpec:
    """fedvit's timm ViT of a run config as a spec: the configured head and size overrides, never pretrained
    weights (the attacks take the weights from the capture); cached, one probe model per config."""
    from fedvit.core.model import build_model

    model_config = dataclasses.replace(config.model, pretrained="off")

    def builder() -> nn.Module:
        return build_model(model_config, num_classes, config.seed)

    probe = builder()
    pretrained = getattr(probe, "pretrained_cfg", None) or {}
    height, width = (int(v) for v in probe.patch_embed.img_size)  # img-size 0 means timm's default
    return ModelSpec(
        factory=f"fedvit {model_config.name}",
        input_shape=(int(probe.patch_embed.proj.in_channels), height, width),
        mean=tuple(float(v) for v in pretrained.get("mean", (0.5,) * 3)),
        std=tuple(float(v) for v in pretrained.get("std", (0.5,) * 3)),
        first_block=model_config.first_block,
        builder=builder,
    )


@functools.lru_cache(maxsize=4)
def model_skeleton(config: Config, num_classes: int) -> nn.Module:
    """fedvit's model of a run config (cached; its weights are not what a client received)."""
    return fedvit_spec(config, num_classes).build()


def stated(config: Config, server_round: int) -> dict[str, Any]:
    """What fedvit's run config states of its clients' local work, under the keys any app's records use
    (:data:`fedvit.observed.recipe.RECIPE_KEYS`): the learning rate of ``server_round`` after decay, plain SGD
    without weight decay (``fedvit.clients.training``), and fedvit's LocalDpMod (sensitivity C, ε of one release:
    ``fedvit.clients.privacy``)."""
    values: dict[str, Any] = {"lr": config.lr_at(server_round), "momentum": config.momentum,
                              "local-epochs": config.local_epochs, "batch-size": config.batch_size,
                              "optimizer": "sgd", "weight-decay": 0.0}  # fmt: skip
    if config.dp.mode == "local":
        values |= {"local-dp-epsilon": local_epsilon(config.dp), "local-dp-delta": config.dp.delta,
                   "local-dp-clipping-norm": config.dp.clipping_norm,
                   "local-dp-sensitivity": config.dp.clipping_norm}  # fmt: skip
    return values


def fedvit_recipe(config: Config, meta: dict[str, Any]) -> ClientRecipe:
    """A fedvit client's recipe: :func:`stated` read as any app's run config, the reply's ``num-examples`` (else
    the batch size) and, under central DP, Flower's client-side clipping norm as its ConfigRecord carries it.
    What only fedvit's clients do is added after: Madry AT's adversarial share of each batch and FedProx's μ."""
    server_round = int(meta.get("round") or 1)
    examples = meta.get("num-examples")
    records = Records(
        label=f"{meta.get('label') or 'update'}",
        run_config=stated(config, server_round),
        received_config={"clipping_norm": config.dp.clipping_norm} if config.dp.mode == "central" else {},
        sent_metrics={} if examples is None else {"num-examples": examples},
    )
    kind = "gradient" if config.strategy in GRADIENT_STRATEGIES else "weights"
    client = read_recipe(records, kind, {})
    sources = dict(client.sources)
    adversarial = int(np.floor(config.adversarial.ratio * client.batch)) if config.adversarial.enabled else 0
    if adversarial:
        sources["adversarial"] = f"{adversarial} of each batch by PGD (run config adversarial.*)"
    mu = config.fedprox.mu if config.strategy == "fedprox" else 0.0
    if mu:
        sources["proximal μ"] = f"{mu:g} (run config fedprox.mu)"
    if config.data.augment != "none":
        sources["augmentation"] = f"{config.data.augment} (run config data.augment; padded crops not simulated)"
    return dataclasses.replace(client, adversarial=adversarial, proximal_mu=mu, sources=tuple(sources.items()),
                               pgd=attack_from(config.adversarial) if adversarial else None)  # fmt: skip


def defence(config: Config) -> Defence:
    """The defence a run switched on, as its public run config names it."""
    return Defence(
        name=defence_of(config),
        strategy=config.strategy,
        mask_mode=config.mask.mode if config.strategy == "masked-fedsgd" else None,
        encryption=config.encryption.mode,
        dp=config.dp.enabled,
    )


def fedvit_observation(
    config: Config, update: dict[str, np.ndarray], received: dict[str, np.ndarray], num_classes: int, **fields: Any
) -> Observation:
    """An update of fedvit's app as an attacker holds it: the model, recipe, defence and seed its run config names
    (``fields``: the rest of :class:`~fedvit.observed.observation.Observation`'s, e.g. ``masks`` and ``meta``)."""
    meta = fields.pop("meta", {})
    from fedvit.core.data import load_dataset

    return Observation(
        update=update,
        received=received,
        num_classes=num_classes,
        meta=meta,
        spec=fedvit_spec(config, num_classes),
        skeleton=model_skeleton(config, num_classes),
        client=fedvit_recipe(config, meta),
        defence=defence(config),
        seed=config.seed,
        test_split=functools.partial(load_dataset, config.data, config.seed, "test"),
        **fields,
    )
