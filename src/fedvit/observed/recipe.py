"""The client's local work as the attacker reads it from a capture: what the reply carries (a gradient or new
weights), the arrays mapped onto the attacked model by name or order, and the recipe (batch, epochs, lr, momentum)
with where each value came from. Read once per exchange; every attack takes the result."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from torch import nn

from fedvit.capture.reader import AuditInputError, Exchange
from fedvit.clients.adversarial import PGD
from fedvit.clients.privacy import local_dp_noise_std
from fedvit.observed.app_code import CodeRecipe
from fedvit.observed.augmentation import Augmentation, AugmentationError
from fedvit.observed.augmentation import parse as parse_augmentation

# A reply's per-layer norm against the received weights', ‖sent‖ / ‖received‖, whatever the learning rate: a gradient
# is small beside the weights (below GRADIENT_RATIO), weights after local training keep their scale or grow (above
# WEIGHTS_RATIO; long training at a large lr grows them many-fold). In between the audit asks for --sent.
GRADIENT_RATIO, WEIGHTS_RATIO = 0.2, 0.5
RECIPE_KEYS = {  # recipe value -> names apps use for it (ConfigRecord, run config, reply metrics)
    "lr": ("lr", "learning-rate", "learning_rate"),
    "epochs": ("local-epochs", "local_epochs", "epochs"),
    "local-steps": ("local-steps", "local_steps"),
    "batch-size": ("batch-size", "batch_size"),
    "momentum": ("momentum",),
    "weight-decay": ("weight-decay", "weight_decay"),
    "num-examples": ("num-examples", "num_examples"),
}
OPTIMISER_KEYS = ("optimizer", "optimiser", "optim")  # a name: "sgd", "adam", "adamw", ...
FLOWER_CLIPPING_NORM = "clipping_norm"  # the key Flower's DifferentialPrivacyClientSide*Clipping put in the config
AUGMENT_KEYS = ("augment", "augmentation")  # e.g. "crop+flip" (fedvit.observed.augmentation)
SIMULATED_OPTIMISERS = ("sgd", "adam", "adamw")  # the step rules of fedvit's simulations of local training
ADAM_FAMILY = ("adam", "adamw")  # no momentum of SGD's: betas (torch's defaults assumed where no record has them)


PRIVACY_KEYS = {  # differential-privacy claim -> names apps use for it (Opacus' in Flower's example, then hyphenated)
    "epsilon": ("epsilon", "dp-epsilon", "dp_epsilon"),
    "delta": ("target_delta", "delta", "dp-delta", "target-delta"),
    "noise-multiplier": ("noise_multiplier", "noise-multiplier"),
    "clipping-norm": ("max_grad_norm", "max-grad-norm", "clipping-norm", "clipping_norm"),
}
LOCAL_DP_KEYS = {  # Flower's LocalDpMod(clipping_norm, sensitivity, epsilon, delta), where an app records them
    "epsilon": ("local-dp-epsilon", "local_dp_epsilon"),
    "delta": ("local-dp-delta", "local_dp_delta"),
    "clipping-norm": ("local-dp-clipping-norm", "local-dp-clip", "local_dp_clipping_norm", "local_dp_clip"),
    "sensitivity": ("local-dp-sensitivity", "local_dp_sensitivity"),
}


@dataclass(frozen=True)
class Records:
    """What a recipe is read from when there is no captured exchange: fedvit's own run config as it states its
    recipe (:mod:`fedvit.audit.fedvit_run`), under the same names as an exchange's records."""

    label: str
    run_config: dict[str, Any] = field(default_factory=dict)
    received_config: dict[str, Any] = field(default_factory=dict)
    sent_metrics: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PrivacyClaim:
    """The (ε, δ) differential privacy a client claims for its training data, and the DP-SGD parameters it states
    (None where no record carries them); ``source``: where the claim was read. ``update_noise``: Flower's
    ``LocalDpMod`` instead — the update clipped to ``update_clip`` and Gaussian noise of this std added to every
    entry, (ε, δ) per update."""

    epsilon: float
    delta: float
    noise_multiplier: float | None
    clipping_norm: float | None
    source: str
    update_clip: float | None = None
    update_noise: float | None = None

    def described(self) -> str:
        if self.update_noise is not None:
            return (f"ε {self.epsilon:g} per update, δ {self.delta:g} (Flower's LocalDpMod: the update clipped to norm "
                    f"{self.update_clip:g}, Gaussian noise of std {self.update_noise:.3g} on every entry; "
                    f"{self.source})")  # fmt: skip
        extra = "".join(f", {name} {value:g}" for name, value in (("noise multiplier", self.noise_multiplier),
                                                                   ("clipping norm", self.clipping_norm))
                        if value is not None)  # fmt: skip
        return f"ε {self.epsilon:g}, δ {self.delta:g}{extra} ({self.source})"


def recorded_number(
    ex: Exchange | Records, key: str, names: tuple[str, ...], source: str, values: dict
) -> float | None:
    """The first of ``names`` that ``values`` (one record of ``source``) holds, as a number (None: none holds one;
    a value that is not a number is refused, naming ``key`` and ``source``)."""
    hit = next((values[a] for a in names if a in values and values[a] not in ("", None)), None)
    if hit is None:
        return None
    try:
        return float(hit)
    except (TypeError, ValueError) as err:
        raise AuditInputError(f"{ex.label}: {key} = {hit!r} ({source}) is not a number") from err


def read_privacy_claim(ex: Exchange | Records, overrides: dict[str, str] | None = None) -> PrivacyClaim | None:
    """The DP claim an update carries, or None without an ε: Flower's ``LocalDpMod`` settings
    (:data:`LOCAL_DP_KEYS`) or a DP-SGD claim (:data:`PRIVACY_KEYS`), declared (``--recipe``) or in its reply
    metrics, ConfigRecord or run config. A DP-SGD claim without a δ is read as pure ε-DP (δ = 0); a LocalDpMod
    claim needs all four settings (its noise depends on each), and a ``local-dp-epsilon`` ≤ 0 is none (the mod
    needs ε > 0: apps use 0 for "off")."""
    for source, values in (("override", overrides or {}), ("reply metrics", ex.sent_metrics),
                           ("ConfigRecord", ex.received_config), ("run config", ex.run_config)):  # fmt: skip
        local = {key: value for key, names in LOCAL_DP_KEYS.items()
                 if (value := recorded_number(ex, key, names, source, values)) is not None}  # fmt: skip
        if local.get("epsilon", 0) > 0:  # ε ≤ 0: LocalDpMod off (it needs ε > 0), as apps switch it
            if missing := [LOCAL_DP_KEYS[key][0] for key in LOCAL_DP_KEYS if key not in local]:
                raise AuditInputError(
                    f"{ex.label}: local-dp-epsilon ({source}) without {', '.join(missing)}: LocalDpMod's noise "
                    f"depends on every setting; give --recipe {missing[0]}=… (the values in the app's LocalDpMod)"
                )
            std = local_dp_noise_std(local["sensitivity"], local["epsilon"], local["delta"])
            return PrivacyClaim(local["epsilon"], local["delta"], None, None, source, local["clipping-norm"], std)
        found = {key: value for key, names in PRIVACY_KEYS.items()
                 if (value := recorded_number(ex, key, names, source, values)) is not None}  # fmt: skip
        if "epsilon" in found:
            return PrivacyClaim(found["epsilon"], found.get("delta", 0.0), found.get("noise-multiplier"),
                                found.get("clipping-norm"), source)  # fmt: skip
    return None


@dataclass(frozen=True)
class ClientRecipe:
    """The client's local work as the attacker reads it (run config, ConfigRecord, reply metrics)."""

    examples: int  # distinct images the client trained on (the reply's num-examples)
    batch: int  # images per local step
    epochs: int  # passes over them (FedAvg local epochs; 1 for FedSGD)
    lr: float  # the client's learning rate (FedAvg/FedProx)
    momentum: float  # its SGD momentum
    proximal_mu: float  # FedProx μ (0 otherwise)
    adversarial: int  # samples per step replaced by their PGD versions (Madry AT), 0 if off
    sends_gradient: bool  # FedSGD: the update is the gradient; FedAvg: the update is the new weights
    lr_known: bool = True  # False: no record carries the lr (``lr`` is then a stand-in)
    momentum_known: bool = True  # False: no record carries the momentum (``momentum`` is then assumed)
    # (value, where it came from) as the report states them, e.g. ("lr", "0.05 (ConfigRecord)"); empty: run config
    sources: tuple[tuple[str, str], ...] = field(default=(), compare=False)
    privacy: PrivacyClaim | None = None  # the DP the client claims (its records), tested by the membership audit
    optimiser: str | None = None  # the optimiser a record names (lower case); None: none does (SGD assumed)
    augment: Augmentation | None = None  # the random augmentation declared (None: none, assumed where not said)
    update_clip: float | None = None  # the update's norm bound (Flower's client-side clipping or LocalDpMod)
    update_noise: float | None = None  # the Gaussian std LocalDpMod added to every entry of the clipped update
    pgd: PGD | None = None  # Madry AT's attack on ``adversarial`` samples of each step (fedvit's adversarial.*)

    def described(self) -> str:
        """Every value with where it came from ("lr 0.05 (ConfigRecord); momentum 0 (assumed plain SGD); ...")."""
        return "; ".join(f"{key} {value}" for key, value in self.sources) or "from the run config"

    def source_of(self, key: str) -> str:
        """Where the recipe's ``key`` came from, as the report states it ("" where nothing is said)."""
        return dict(self.sources).get(key, "")

    def assumed(self) -> list[str]:
        """The values no record carries and nothing estimated (the report's assumptions of this update)."""
        return [f"{key} {value}" for key, value in self.sources if "assumed" in value or "unknown" in value]

    def with_inferred(self, optimiser: str, momentum: float, how: str, without_augment: bool = False) -> ClientRecipe:
        """This recipe with the optimiser and SGD momentum inferred from the update (``how``: the evidence),
        everywhere it is used; ``without_augment``: the declared augmentation fit the update worse than none, and is
        dropped (the report says so)."""
        inferred = {"optimiser": f"{optimiser} (inferred from the update: {how})",
                    "momentum": f"{momentum:g} (inferred from the update)" if optimiser == "sgd" else
                    f"— ({optimiser}: betas 0.9, 0.999, eps 1e-8, torch's defaults, assumed)"}  # fmt: skip
        augment = self.augment
        if without_augment and augment is not None:
            inferred["augmentation"] = (f"none (inferred from the update: the declared {augment.describe()} fit it "
                                        "worse than none)")  # fmt: skip
            augment = None
        sources = dict(self.sources) | inferred
        return dataclasses.replace(self, optimiser=optimiser, momentum=momentum, momentum_known=True, augment=augment,
                                   sources=tuple(sources.items()))  # fmt: skip

    @property
    def steps(self) -> int:
        """Local optimiser steps: ⌈examples / batch⌉ per epoch."""
        return self.epochs * math.ceil(self.examples / self.batch)

    @property
    def several_steps(self) -> bool:
        """Weights after more than one local step: the softmax moved while the client trained."""
        return not self.sends_gradient and self.steps > 1


OPACUS_PREFIX = "_module."  # Opacus' GradSampleModule keeps the wrapped model under ``_module``


def map_state(arrays: dict[str, np.ndarray], model: nn.Module, what: str) -> dict[str, np.ndarray]:
    """``arrays`` keyed by the model's ``state_dict`` names (an Opacus-wrapped model's ``_module.`` prefix
    removed): by name when the keys are the state_dict's; by order
    (all of the state_dict, or its parameters only) when no key is a state_dict name (e.g. "0", "1", ... from a
    list of arrays) and every shape agrees; else one error that lists the keys and shapes that do not match."""
    state = {n: tuple(t.shape) for n, t in model.state_dict().items()}
    params = {n: tuple(p.shape) for n, p in model.named_parameters()}
    if arrays and not set(arrays) & set(state) and all(n.startswith(OPACUS_PREFIX) for n in arrays):
        arrays = {n.removeprefix(OPACUS_PREFIX): a for n, a in arrays.items()}  # an Opacus-wrapped model's state_dict
    got = {n: tuple(a.shape) for n, a in arrays.items()}
    if set(got) <= set(state) and set(params) <= set(got):
        wrong = [f"{n}: captured {got[n]}, model {state[n]}" for n in got if got[n] != state[n]]
        if not wrong:
            return dict(arrays)
        raise AuditInputError(f"{what}: shapes differ from the model's state_dict: {'; '.join(wrong[:8])}")
    values = list(arrays.values())
    for names in (list(state), list(params)) if not set(got) & set(state) else ():  # keys that are not names
        if len(values) == len(names) and all(tuple(v.shape) == state[n] for v, n in zip(values, names, strict=True)):
            return dict(zip(names, values, strict=True))
    missing = [n for n in state if n not in got][:8]
    unexpected = [n for n in got if n not in state][:8]
    raise AuditInputError(
        f"{what}: the captured arrays match the model neither by name nor by order ({len(got)} captured, "
        f"{len(state)} in the state_dict, {len(params)} parameters); missing {missing}, unexpected {unexpected} "
        "— is --model the app's model?"
    )


def map_part(arrays: dict[str, np.ndarray], model: nn.Module, what: str) -> tuple[dict[str, np.ndarray], str]:
    """(``arrays`` keyed by the model's ``state_dict`` names, the submodule they cover: "" for the whole model).
    A capture of part of the model (a head fine-tuned on a frozen backbone, sent as ``model.heads.state_dict()``
    or as its list of arrays) is mapped onto the one submodule it fits as :func:`map_state` fits a model; the
    whole model's error when none does, one that names the candidates when several do."""
    try:
        return map_state(arrays, model, what), ""
    except AuditInputError as whole:
        fits: dict[tuple[str, ...], tuple[str, dict[str, np.ndarray]]] = {}  # a head and its only child: one fit
        for name, module in model.named_modules():
            if name and any(True for _ in module.parameters()):
                try:
                    mapped = {f"{name}.{key}": value for key, value in map_state(arrays, module, what).items()}
                except AuditInputError:
                    continue
                fits.setdefault(tuple(mapped), (name, mapped))
        if len(fits) == 1:
            name, mapped = next(iter(fits.values()))
            return mapped, name
        if fits:
            raise AuditInputError(
                f"{what}: the captured arrays fit several parts of the model "
                f"({', '.join(n for n, _ in list(fits.values())[:8])}): "
                "send them keyed by their state_dict names"
            ) from None
        raise whole


# ---------------------------------------------------------------------------- the client's recipe


def sent_kind(received: dict[str, np.ndarray], sent: dict[str, np.ndarray], names: list[str]) -> tuple[str, str]:
    """("weights" | "gradient" | "ambiguous", the evidence): the median over the layers (those received non-zero)
    of ‖sent‖ / ‖received‖, and how many layers agree with it (see :data:`GRADIENT_RATIO`)."""
    ratios = [
        math.sqrt(float(np.sum(sent[n].astype(np.float64) ** 2)) / r2)
        for n in names
        if (r2 := float(np.sum(received[n].astype(np.float64) ** 2))) > 0
    ]
    median = float(np.median(ratios)) if ratios else 0.0
    kind = "gradient" if median < GRADIENT_RATIO else "weights" if median > WEIGHTS_RATIO else "ambiguous"
    side = [r < GRADIENT_RATIO if kind == "gradient" else r > WEIGHTS_RATIO for r in ratios]
    return kind, f"median ‖sent‖/‖received‖ {median:.3g}, {sum(side)} of {len(ratios)} layers agree"


def recipe_records(ex: Exchange | Records, overrides: dict[str, str]) -> list[tuple[str, dict]]:
    """(source, values) in the order a recipe value is looked up: the overrides, the received ConfigRecord, the run
    config, the reply's metrics."""
    return [("override", overrides), ("ConfigRecord", ex.received_config), ("run config", ex.run_config),
            ("reply metrics", ex.sent_metrics)]  # fmt: skip


def recorded_name(ex: Exchange | Records, overrides: dict[str, str], keys: tuple[str, ...]) -> tuple[str, str] | None:
    """(a name in lower case, where it was read) under one of ``keys`` in the overrides, the ConfigRecord, the run
    config or the reply's metrics; None where no record has one."""
    for source, values in recipe_records(ex, overrides):
        hit = next((values[k] for k in keys if values.get(k) not in ("", None)), None)
        if hit is not None:
            return str(hit).strip().lower(), source
    return None


def told(overrides: dict[str, str], keys: tuple[str, ...]) -> tuple[str, str] | None:
    """(a name in lower case, "override") where ``--recipe`` gives one of ``keys``; None otherwise."""
    hit = next((overrides[k] for k in keys if overrides.get(k) not in ("", None)), None)
    return None if hit is None else (str(hit).strip().lower(), "override")


def recorded_optimiser(ex: Exchange | Records, overrides: dict[str, str]) -> tuple[str, str] | None:
    """(the optimiser's name in lower case, where it was read) under :data:`OPTIMISER_KEYS`; None where no record
    names one."""
    found = recorded_name(ex, overrides, OPTIMISER_KEYS)
    return None if found is None else (found[0].removeprefix("torch.optim."), found[1])


def recorded_augmentation(ex: Exchange | Records, overrides: dict[str, str]) -> tuple[Augmentation, str] | None:
    """(the augmentation, where it was read) under :data:`AUGMENT_KEYS`; None where none is recorded (or it is
    "none"); an :class:`AuditInputError` for one the audit does not model."""
    found = recorded_name(ex, overrides, AUGMENT_KEYS)
    if found is None:
        return None
    try:
        augmentation = parse_augmentation(found[0])
    except AugmentationError as err:
        raise AuditInputError(f"{ex.label}: {err} ({found[1]})") from err
    return None if augmentation is None else (augmentation, found[1])


CODE_NUMBERS = {"lr": "lr", "momentum": "momentum", "epochs": "epochs", "batch-size": "batch_size"}


def code_augmentation(code: CodeRecipe) -> tuple[Augmentation | None, str] | None:
    """The augmentation the code's random transforms amount to, as the simulations model it (random resized crops
    and horizontal flips), and its sources; the transforms they do not model named beside. None: no random
    transform in the code."""
    if not code.transforms:
        return None
    crops = [t for t in code.transforms if t.name == "RandomResizedCrop"]
    flips = [t for t in code.transforms if t.name == "RandomHorizontalFlip"]
    padded = [t for t in code.transforms if t.name == "RandomCrop" and t.padding is not None]  # shifts
    other = [t for t in code.transforms if t not in crops + flips + padded]
    scale = crops[0].crop_scale if crops else None
    padding = padded[0].padding if padded else None
    augmentation = Augmentation(scale, bool(flips), padding) if (scale, padding) != (None, None) or flips else None
    where = ", ".join(f"{t.name}({t.arguments}) {t.source}" for t in crops + padded + flips)
    text = f"{augmentation.describe()} (app code: {where})" if augmentation else "none simulated"
    if crops and scale is None:
        text += f"; the crop's scale at {crops[0].source} is not read statically: crops not simulated"
    if other:
        text += "; also " + ", ".join(f"{t.name}({t.arguments}) {t.source}" for t in other) + (
            " in the code, which the simulations do not model")  # fmt: skip
    return augmentation, text


def read_recipe(
    ex: Exchange | Records, kind: str, overrides: dict[str, str], code: CodeRecipe | None = None
) -> ClientRecipe:
    """The recipe from (first found) the overrides, the app's code (:mod:`fedvit.observed.app_code`), the received
    ConfigRecord, the run config, the reply's metrics; defaults: full batch, one epoch, no momentum; the optimiser
    left open (None: inferred from the update) where nothing states it. ``local-steps`` (when given) fixes the
    images processed to steps × batch size. The recipe holds, per value, where it came from (``sources``)."""
    found: dict[str, tuple[float, str]] = {}
    code_values = code.values() if code is not None else {}
    for key, aliases in RECIPE_KEYS.items():
        stated = code_values.get(CODE_NUMBERS.get(key, "").replace("_", " "))
        for source, values in recipe_records(ex, overrides):
            if source != "override" and stated is not None and stated.read and isinstance(stated.value, int | float):
                found[key] = (float(stated.value), f"app code: {stated.source}" + (
                    f", {stated.how}" if stated.how else ""))  # fmt: skip
                break
            if (value := recorded_number(ex, key, (key, *aliases), source, values)) is not None:
                found[key] = (value, source)
                break
    sources: dict[str, str] = {}
    for key, value in code_values.items():  # what the code leaves unread, and what it says that no key carries
        if not value.read and key != "optimiser":
            sources[key] = value.described()

    def take(key: str, default: float | None, why: str) -> float | None:
        if key in found:
            value, source = found[key]
            sources[key] = f"{value:g} ({source})"
            return value
        sources[key] = f"{default:g} ({why})" if default is not None else f"unknown ({why})"
        return default

    examples = take("num-examples", None, "not sent")
    batch = take("batch-size", examples, "assumed: the whole local dataset")
    if examples is None and batch is None:
        raise AuditInputError(f"{ex.label}: neither num-examples nor batch-size is known: give --recipe batch-size=B")
    steps = take("local-steps", None, "from epochs") if "local-steps" in found else None
    if steps is not None:
        examples = int(steps) * int(batch)
        sources["num-examples"] = f"{examples} (local-steps × batch-size)"
    examples = int(examples if examples is not None else batch)
    batch = int(min(batch or examples, examples))
    claim = read_privacy_claim(ex, overrides)
    if claim is not None:
        sources["privacy claim"] = claim.described()
    optimiser = told(overrides, OPTIMISER_KEYS)
    optimiser = optimiser and (optimiser[0].removeprefix("torch.optim."), optimiser[1])
    stated = code_values.get("optimiser")
    if optimiser is None and stated is not None:
        if stated.read:
            optimiser = (stated.value, f"app code: {stated.source}, {stated.how}")
        else:
            sources["optimiser"] = f"{stated.described()}: inferred from the update instead"
    optimiser = optimiser or recorded_optimiser(ex, overrides)
    if optimiser is not None:
        sources["optimiser"] = f"{optimiser[0]} ({optimiser[1]})"
    for key in ("weight decay", "betas", "trained"):
        if key in code_values and code_values[key].read:
            sources[key] = f"{code_values[key].described()}".replace(" (", " (app code: ", 1)
    if "weight-decay" in found and ("weight decay" not in sources or found["weight-decay"][1] == "override"):
        sources["weight decay"] = f"{found['weight-decay'][0]:g} ({found['weight-decay'][1]})"
    if code is not None and code.frozen:
        sources["frozen"] = "; ".join(f.described().replace(" (", " (app code: ", 1) for f in code.frozen)
    augment_told = told(overrides, AUGMENT_KEYS) is not None
    augment = recorded_augmentation(ex, overrides) if augment_told else None
    from_code = code_augmentation(code) if code is not None and not augment_told else None
    if augment is None and from_code is not None:
        sources["augmentation"] = from_code[1]
        augment = None if from_code[0] is None else (from_code[0], "")
    elif augment is None and not augment_told:
        augment = recorded_augmentation(ex, overrides)
    if augment is not None and "augmentation" not in sources:
        sources["augmentation"] = f"{augment[0].describe()} ({augment[1]})"
    if code is not None and not code.transforms and augment is None and not augment_told:
        sources["augmentation"] = f"none (no random transform in {code.app}'s training code)"
    update_clip = recorded_number(ex, "clipping_norm", (FLOWER_CLIPPING_NORM,), "ConfigRecord", ex.received_config)
    if update_clip is not None:
        sources["update clipping"] = (
            f"norm {update_clip:g} (ConfigRecord: Flower's client-side clipping; the server adds its noise after "
            "aggregation, so this update travels clipped, not noised: no DP against an eavesdropper on the link)"
        )
    if code is not None and code.central_dp is not None:
        sources["central DP"] = code.central_dp.described()
    if code is not None and code.kept_state is not None:
        sources["client state"] = (f"{code.kept_state.value} restored from the client's context.state (app code: "
                                   f"{code.kept_state.source}): from its second round the client trains from its own "
                                   f"{code.kept_state.value}, not the one it received, and the simulations start "
                                   "from the received weights")  # fmt: skip
    update_noise = None
    if claim is not None and claim.update_noise is not None:  # LocalDpMod: clipped and noised before it left
        update_clip, update_noise = claim.update_clip, claim.update_noise
        sources["update clipping"] = (f"norm {update_clip:g}, then Gaussian noise of std {update_noise:.3g} on every "
                                      f"entry (Flower's LocalDpMod, {claim.source})")  # fmt: skip
    if kind == "gradient":  # FedSGD: one step on every example; lr, epochs and momentum play no part
        sources["sent"] = "a gradient: one step on all examples"
        return ClientRecipe(examples, examples, 1, 0.0, 0.0, 0.0, 0, True, sources=tuple(sources.items()),
                            privacy=claim, optimiser=optimiser and optimiser[0])  # fmt: skip
    epochs = 1 if steps is not None else int(take("epochs", 1, "assumed"))
    lr = take("lr", None, "scale estimated for labels; 0.01 simulated")
    adam = optimiser is not None and optimiser[0] in ADAM_FAMILY
    if adam and "momentum" not in found:  # Adam's betas play its part: the report says so, not "plain SGD"
        decay = ", weight decay 0.01" if optimiser[0] == "adamw" else ""
        sources["momentum"] = (
            f"— ({optimiser[0]}: its betas instead)"
            if "betas" in sources
            else f"— ({optimiser[0]}: betas 0.9, 0.999, eps 1e-8{decay}, torch's defaults, assumed)"
        )
        momentum = 0.0
    else:
        momentum = take("momentum", 0.0, "assumed plain SGD") or 0.0
    lr_known = lr is not None
    return ClientRecipe(examples, batch, epochs, lr if lr_known else 0.01, momentum, 0.0, 0, False, lr_known,
                        momentum_known="momentum" in found or adam, sources=tuple(sources.items()), privacy=claim,
                        optimiser=optimiser and optimiser[0], augment=augment and augment[0],
                        update_clip=update_clip, update_noise=update_noise)  # fmt: skip
