"""Typed, validated run configuration parsed once from ``context.run_config``."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fedvit.core.budget import AuditConfig
from fedvit.core.masks import MaskConfig, effective_rates, parse_patterns
from fedvit.core.params import PATCH_EMBED_WEIGHT

STRATEGIES = ("fedsgd", "fedavg", "masked-fedsgd", "fedwavg", "fedprox", "scaffold")
SERVER_LR_STRATEGIES = ("fedsgd", "masked-fedsgd")  # the server applies lr itself (eq. 10)
MASK_MODES = ("fresh", "locked", "fixed-position")
PARTITIONERS = ("iid", "noniid-k", "dirichlet")
DATASETS = ("synthetic", "cifar10", "imagefolder:<path>")
DEVICES = ("auto", "cpu", "cuda")
FIRST_BLOCKS = ("pre-ln", "no-ln")
CLIENT_EVAL = ("split", "test-shard")
ENCRYPTION_MODES = ("off", "paper", "private-init")
ROBUST_ATTACKS = ("pgd", "autoattack")
AUTOATTACK_VERSIONS = ("standard", "apgd")  # fedvit.clients.autoattack
AUDIT_INIT = ("noise", "gaussian", "test-split")  # fedvit.attacks.inversion: the restarts' starting points
AUDIT_KEEP = ("match", "objective")  # fedvit.attacks.inversion: which candidate the optimisation attack returns
AUDIT_PRIOR_SCHEDULE = ("constant", "cosine")  # fedvit.attacks.inversion: the image priors' weight over the steps
DP_MODES = ("off", "central", "local")
DP_STRATEGIES = ("fedsgd", "fedavg", "fedprox")  # one plain update per client: clipping bounds its contribution
# SecAgg+ reveals one weighted mean of the client models, which is all these aggregate; why each other one cannot
# compose with it (the refusal's one line)
SECAGG_STRATEGIES = ("fedavg", "fedprox")
SECAGG_REFUSALS = {
    "fedsgd": "the server steps with its lr along the mean gradient, while SecAgg+ runs Flower's FedAvg, whose "
    "aggregate is the new model (use strategy='fedavg')",
    "masked-fedsgd": "eq. 12 divides each entry by the number of clients that kept it, which needs every client's "
    "mask; SecAgg+ reveals only the sum",
    "fedwavg": "its weights need each client's last layer (cosine with the global one); SecAgg+ reveals only the sum",
    "scaffold": "it needs each client's control-variate change beside its model; SecAgg+ sums one vector per client",
}
QUANTIZATION_LIMIT = 2**31  # Flower's SecAgg+ masks modulo 2**32: the quantised sum of the clients must fit below it
HEADS = ("cls", "vis", "cls+vis")
AUGMENTATIONS = ("none", "crop-flip")


class ConfigError(ValueError):
    """A config value is invalid; the message names the key, the value and what is allowed."""

    def __init__(self, key: str, value: Any, allowed: str) -> None:
        self.key, self.value, self.allowed = key, value, allowed
        super().__init__(f"config error: {key}={value!r} is invalid; allowed: {allowed}")


@dataclass(frozen=True)
class ModelConfig:
    """Which timm ViT to build; 0 for an override means "timm's default"."""

    name: str = "vit_tiny_patch16_224"
    img_size: int = 32
    patch_size: int = 8
    embed_dim: int = 64
    depth: int = 2
    num_heads: int = 4
    pretrained: str = "off"  # "off" | "hub" | path to a weights file
    first_block: str = "pre-ln"  # "pre-ln" (timm) | "no-ln" (APRIL's architecture A, for the paper's attack)
    head: str = "vis"  # "cls" (class token) | "vis" (mean of the patch tokens) | "cls+vis" (two heads, logits summed)


@dataclass(frozen=True)
class DataConfig:
    """Dataset, partitioning and loading options."""

    name: str = "synthetic"
    root: str = "data"
    download: bool = True
    synthetic_train_size: int = 1200
    synthetic_test_size: int = 300
    synthetic_num_classes: int = 10
    partitioner: str = "iid"
    classes_per_client: int = 2
    dirichlet_alpha: float = 0.5
    client_test_fraction: float = 0.2
    client_eval: str = "split"  # "split" (of the partition) | "test-shard" (of the official test set)
    augment: str = "none"  # "crop-flip": random crop with padding (28 px at 224, scaled) + horizontal flip

    @property
    def imagefolder_path(self) -> str | None:
        return self.name.split(":", 1)[1] if self.name.startswith("imagefolder:") else None


@dataclass(frozen=True)
class FedWAvgConfig:
    """FedWAvg (strategy "fedwavg"): the softmax scale q and the parameters that form the "last layer"."""

    q: float = 1.0
    last_layer: str = "head.weight,head.bias"

    @property
    def last_layer_names(self) -> tuple[str, ...]:
        return tuple(n.strip() for n in self.last_layer.split(",") if n.strip())


@dataclass(frozen=True)
class AdversarialConfig:
    """Madry adversarial training on the clients (FedWAvg paper, Algorithm 1, lines 14-18; Sec. 4.1 defaults).

    ε and α are in units of 1/255 of the [0, 1] pixel range (8 means 8/255).
    """

    enabled: bool = False
    eps_255: float = 8.0
    alpha_255: float = 2.0
    steps: int = 7
    ratio: float = 0.5


@dataclass(frozen=True)
class RobustConfig:
    """Robust accuracy under L∞ PGD, next to natural accuracy, wherever the model is evaluated.

    ``max_samples`` > 0 evaluates robustness on that many test samples, a seeded class-stratified sample that is
    the same every round (PGD costs steps + 1 forward and backward passes per sample).
    ``attack = "autoattack"`` adds AutoAttack (``fedvit.clients.autoattack``; ``version`` "standard" or the cheaper
    "apgd") on the same samples and ε, at every ``every``-th round and always the last; PGD still runs every round.
    """

    enabled: bool = False
    eps_255: float = 8.0
    alpha_255: float = 2.0
    steps: int = 10
    restarts: int = 1
    max_samples: int = 0
    attack: str = "pgd"
    version: str = "standard"
    every: int = 10


@dataclass(frozen=True)
class FedProxConfig:
    """FedProx (strategy "fedprox"): the proximal term's μ (FedWAvg paper, Sec. 4.1: 0.1)."""

    mu: float = 0.1


@dataclass(frozen=True)
class ScaffoldConfig:
    """SCAFFOLD (strategy "scaffold"): the server learning rate η_g (Karimireddy et al., 2020; 1 = their default)."""

    server_lr: float = 1.0


@dataclass(frozen=True)
class CaptureConfig:
    """Capture (fedvit.capture.writer): what to record, for the attack audit.

    ``rounds``/``partitions``: "" for all, else a list such as "1,5,10-12". ``ground_truth``: clients also write
    their true batch to ``<run>/run-<id>/ground-truth/`` (an audit option; the attacks never read it).
    """

    enabled: bool = False
    rounds: str = ""
    partitions: str = ""
    ground_truth: bool = False


@dataclass(frozen=True)
class DPConfig:
    """Differential privacy of the client updates (Gaussian mechanism, per-client fixed clipping).

    Each client clips its model update to L2 norm ``clipping-norm`` (FedSGD: the step lr·g it asks the server to
    take; FedAvg: w_new − w_received). "central": the server adds N(0, (noise-multiplier · C / n)²) to the
    aggregate of the n sampled clients (the wire carries clipped updates only; Flower's ``fixedclipping_mod`` and
    ``DifferentialPrivacyClientSideFixedClipping``). "local": each client adds N(0, (noise-multiplier · C)²)
    itself before sending (Flower's ``LocalDpMod``); ε at ``delta`` is reported for one release. Not with
    encryption (the clip would act on the encrypted update). Central: the run writes the accountant's ε
    (``dp-privacy.json``) and, with ``canaries`` > 0, an empirical ε from canary clients in every aggregate
    (``fedvit.strategies.canaries``).
    """

    mode: str = "off"
    clipping_norm: float = 0.1
    noise_multiplier: float = 1.0
    delta: float = 1e-5
    canaries: int = 0  # central: canary clients in every aggregate, for a one-shot empirical ε (0: none)

    @property
    def enabled(self) -> bool:
        return self.mode != "off"


@dataclass(frozen=True)
class SecAggConfig:
    """Secure aggregation: SecAgg+ (Bell et al., "Secure Single-Server Aggregation with (Poly)Logarithmic
    Overhead", CCS 2020) through Flower's ``SecAggPlusWorkflow`` and ``secaggplus_mod``.

    ``num-shares``: how many clients hold a share of each client's secrets (a number in (0, 1]: that share of the
    sampled clients; an integer >= 3: that many). ``reconstruction-threshold``: how many shares rebuild a secret
    (in (0, 1]: that share of num-shares; an integer >= 2: that many); a round survives a client's dropout while
    every client keeps that many answering share holders. Each client clips its weighted model to
    [-clipping-range, clipping-range] and quantises it to ``quantization-range`` levels. ``max-weight``: the
    largest num-examples a client may weigh in with (0: the largest training partition the clients reported).
    """

    enabled: bool = False
    num_shares: float = 1.0
    reconstruction_threshold: float = 0.6
    clipping_range: float = 8.0
    quantization_range: int = 4194304
    max_weight: float = 0.0


def flower_share_setting(value: float) -> int | float:
    """``secagg.num-shares`` or ``reconstruction-threshold`` as Flower reads it: a float in (0, 1] is a proportion,
    an int a count."""
    return value if value <= 1.0 else int(value)


@dataclass(frozen=True)
class EncryptionConfig:
    """Encrypted-domain aggregation (encrypted-ViT paper); the key itself never enters the run config.

    "paper": the server sends the public initial model and adopts the clients' encryption of it;
    "private-init": clients draw the initial embeddings from the shared secret, so the server never
    holds a plaintext/ciphertext pair of the encrypted layers.
    """

    mode: str = "off"

    @property
    def enabled(self) -> bool:
        return self.mode != "off"


@dataclass(frozen=True)
class Config:
    """Everything a run needs; built only by :func:`parse_config`."""

    run_name: str = ""
    out_dir: str = "outputs"
    seed: int = 0
    num_server_rounds: int = 30
    strategy: str = "fedsgd"
    lr: float = 0.02
    momentum: float = 0.0
    lr_decay: float = 0.0  # per round: lr_t = lr · (1 − lr-decay)^(t − 1) (FedWAvg paper, Sec. 4.1)
    local_epochs: int = 1
    batch_size: int = 64
    fraction_train: float = 1.0
    fraction_evaluate: float = 1.0
    min_nodes: int = 2
    round_timeout: float = 600.0
    accept_failures: bool = True  # False: a round with a failed or rejected train reply stops the run
    centralized_evaluation: bool = True
    eval_every: int = 1
    resume_from: str = ""
    checkpoint_keep: int = 2
    device: str = "auto"
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    mask: MaskConfig = field(default_factory=MaskConfig)
    encryption: EncryptionConfig = field(default_factory=EncryptionConfig)
    capture: CaptureConfig = field(default_factory=CaptureConfig)
    fedwavg: FedWAvgConfig = field(default_factory=FedWAvgConfig)
    fedprox: FedProxConfig = field(default_factory=FedProxConfig)
    scaffold: ScaffoldConfig = field(default_factory=ScaffoldConfig)
    adversarial: AdversarialConfig = field(default_factory=AdversarialConfig)
    robust: RobustConfig = field(default_factory=RobustConfig)
    dp: DPConfig = field(default_factory=DPConfig)
    secagg: SecAggConfig = field(default_factory=SecAggConfig)
    audit: AuditConfig = field(default_factory=AuditConfig)

    def lr_at(self, server_round: int) -> float:
        """The clients' learning rate in ``server_round`` (1-based), after the per-round decay."""
        return self.lr * (1.0 - self.lr_decay) ** max(server_round - 1, 0)

    def to_dict(self) -> dict[str, Any]:
        """Flat, hyphenated form (the same keys as ``[tool.flwr.app.config]``)."""
        flat: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if dataclasses.is_dataclass(value):
                for sub in dataclasses.fields(value):
                    flat[f"{f.name}.{_hyphen(sub.name)}"] = getattr(value, sub.name)
            else:
                flat[_hyphen(f.name)] = value
        return flat

    def fingerprint(self) -> str:
        """Stable key for caches: the whole config as sorted JSON."""
        return json.dumps(self.to_dict(), sort_keys=True)


def _hyphen(name: str) -> str:
    return name.replace("_", "-")


# Per-key checks: (predicate, description of what is allowed).
Check = tuple[Callable[[Any], bool], str]
_POSITIVE: Check = (lambda v: v > 0, "a number > 0")
_POSITIVE_INT: Check = (lambda v: v >= 1, "an integer >= 1")
_NON_NEG_INT: Check = (lambda v: v >= 0, "an integer >= 0 (0 = timm's default)")
_FRACTION: Check = (lambda v: 0.0 <= v <= 1.0, "a number in [0, 1]")
_OPEN_FRACTION: Check = (lambda v: 0.0 < v < 1.0, "a number in (0, 1)")
_EPS_255: Check = (lambda v: 0 <= v <= 255, "a number in [0, 255] (units of 1/255)")
_ALPHA_255: Check = (lambda v: 0 < v <= 255, "a number in (0, 255] (units of 1/255)")


def _one_of(options: tuple[str, ...]) -> Check:
    return (lambda v: v in options, "one of " + ", ".join(options))


def is_dataset_name(value: str) -> bool:
    """A name ``data.name`` takes: synthetic, cifar10 or imagefolder:PATH."""
    if value.startswith("imagefolder:"):
        return len(value) > len("imagefolder:")
    return value in ("synthetic", "cifar10")


def _parses(parser: Callable[[str], Any]) -> Callable[[str], bool]:
    """A check that accepts the values ``parser`` accepts (it raises ValueError on the others)."""

    def check(value: str) -> bool:
        try:
            parser(value)
        except ValueError:
            return False
        return True

    return check


def parse_selection(text: str) -> frozenset[int] | None:
    """ "1,5,10-12" -> {1, 5, 10, 11, 12}; "" -> None (everything). Raises ValueError on a bad item."""
    if not text.strip():
        return None
    out: set[int] = set()
    for item in filter(None, (part.strip() for part in text.split(","))):
        first, sep, last = item.partition("-")
        lo, hi = int(first), int(last) if sep else int(first)
        if lo < 0 or hi < lo:
            raise ValueError(f"{item!r} is not a number or an increasing range")
        out.update(range(lo, hi + 1))
    return frozenset(out)


def _timm_model_name(value: str) -> bool:
    """A name timm builds. The default needs no look-up (every run of the test suite builds it): importing timm
    takes seconds, which ``fedvit run`` would spend before each run on a name that cannot be wrong."""
    if value == ModelConfig.name:
        return True
    import timm

    return value in timm.list_models()


_CHECKS: dict[str, Check] = {
    "seed": (lambda v: v >= 0, "an integer >= 0"),
    "num-server-rounds": _POSITIVE_INT,
    "strategy": _one_of(STRATEGIES),
    "lr": _POSITIVE,
    "momentum": (lambda v: 0.0 <= v < 1.0, "a number in [0, 1)"),
    "lr-decay": (lambda v: 0.0 <= v < 1.0, "a number in [0, 1)"),
    "local-epochs": _POSITIVE_INT,
    "batch-size": _POSITIVE_INT,
    "fraction-train": (lambda v: 0.0 < v <= 1.0, "a number in (0, 1]"),
    "fraction-evaluate": _FRACTION,
    "min-nodes": _POSITIVE_INT,
    "round-timeout": _POSITIVE,
    "eval-every": _POSITIVE_INT,
    "checkpoint-keep": _POSITIVE_INT,
    "device": _one_of(DEVICES),
    "run-name": (lambda v: "/" not in v and v not in (".", ".."), "a name without '/'"),
    "model.name": (_timm_model_name, "a model name from timm.list_models(), e.g. vit_small_patch16_224"),
    "model.img-size": _NON_NEG_INT,
    "model.patch-size": _NON_NEG_INT,
    "model.embed-dim": _NON_NEG_INT,
    "model.depth": _NON_NEG_INT,
    "model.num-heads": _NON_NEG_INT,
    "model.pretrained": (lambda v: v != "", "'off', 'hub' or a path to a weights file"),
    "model.first-block": _one_of(FIRST_BLOCKS),
    "model.head": _one_of(HEADS),
    "data.augment": _one_of(AUGMENTATIONS),
    "data.name": (is_dataset_name, "one of " + ", ".join(DATASETS)),
    "data.synthetic-train-size": _POSITIVE_INT,
    "data.synthetic-test-size": _POSITIVE_INT,
    "data.synthetic-num-classes": (lambda v: v >= 2, "an integer >= 2"),
    "data.partitioner": _one_of(PARTITIONERS),
    "data.classes-per-client": _POSITIVE_INT,
    "data.dirichlet-alpha": _POSITIVE,
    "data.client-test-fraction": _OPEN_FRACTION,
    "data.client-eval": _one_of(CLIENT_EVAL),
    "mask.mode": _one_of(MASK_MODES),
    "mask.r": _FRACTION,
    "mask.r-pos-embed": (lambda v: v == -1.0 or 0.0 <= v <= 1.0, "-1 (use mask.r) or a number in [0, 1]"),
    "mask.r-patch-embed": (lambda v: v == -1.0 or 0.0 <= v <= 1.0, "-1 (use mask.r) or a number in [0, 1]"),
    "mask.r-patterns": (_parses(parse_patterns), "'<name pattern>=<R in [0, 1]>' items separated by ';'"),
    "encryption.mode": _one_of(ENCRYPTION_MODES),
    "fedwavg.q": (lambda v: v >= 0, "a number >= 0 (0: equal weights)"),
    "fedprox.mu": (lambda v: v >= 0, "a number >= 0"),
    "scaffold.server-lr": _POSITIVE,
    "adversarial.eps-255": _EPS_255,
    "adversarial.alpha-255": _ALPHA_255,
    "adversarial.steps": _POSITIVE_INT,
    "adversarial.ratio": _FRACTION,
    "robust.eps-255": (lambda v: 0 < v <= 255, "a number in (0, 255] (units of 1/255; 0 measures nothing)"),
    "robust.alpha-255": _ALPHA_255,
    "robust.steps": _POSITIVE_INT,
    "robust.restarts": _POSITIVE_INT,
    "robust.max-samples": (lambda v: v >= 0, "an integer >= 0 (0 = the whole test set)"),
    "robust.attack": _one_of(ROBUST_ATTACKS),
    "robust.version": _one_of(AUTOATTACK_VERSIONS),
    "robust.every": _POSITIVE_INT,
    "fedwavg.last-layer": (lambda v: any(n.strip() for n in v.split(",")), "parameter names separated by ','"),
    "dp.mode": _one_of(DP_MODES),
    "dp.clipping-norm": _POSITIVE,
    "dp.noise-multiplier": (lambda v: v >= 0, "a number >= 0"),
    "dp.delta": _OPEN_FRACTION,
    "dp.canaries": (lambda v: v >= 0, "an integer >= 0 (0: no canary clients)"),
    "secagg.num-shares": (lambda v: 0 < v <= 1 or (v >= 3 and float(v).is_integer()),
                          "a number in (0, 1] (that share of the sampled clients) or an integer >= 3"),
    "secagg.reconstruction-threshold": (lambda v: 0 < v <= 1 or (v >= 2 and float(v).is_integer()),
                                        "a number in (0, 1] (that share of num-shares) or an integer >= 2"),
    "secagg.clipping-range": _POSITIVE,
    "secagg.quantization-range": (lambda v: 2 <= v < QUANTIZATION_LIMIT, f"an integer in [2, {QUANTIZATION_LIMIT})"),
    "secagg.max-weight": (lambda v: v >= 0, "a number >= 0 (0: the largest training partition)"),
    "audit.iterations": _POSITIVE_INT,
    "audit.restarts": _POSITIVE_INT,
    "audit.max-seconds": _POSITIVE,
    "audit.lr": _POSITIVE,
    "audit.tv": (lambda v: v >= 0, "a number >= 0"),
    "audit.pos-weight": (lambda v: v >= 0, "a number >= 0"),
    "audit.keep": _one_of(AUDIT_KEEP),
    "audit.patch-tv": (lambda v: v >= 0, "a number >= 0"),
    "audit.init": _one_of(AUDIT_INIT),
    "audit.group-weight": (lambda v: v >= 0, "a number >= 0"),
    "audit.prior-schedule": _one_of(AUDIT_PRIOR_SCHEDULE),
    "capture.rounds": (_parses(parse_selection), "'' (all) or numbers and ranges, e.g. '1,5,10-12'"),
    "capture.partitions": (_parses(parse_selection), "'' (all) or numbers and ranges, e.g. '0,2-3'"),
}


def _coerce(key: str, value: Any, default: Any) -> Any:
    """Convert a TOML value to the default's type, refusing lossy conversions."""
    if isinstance(default, bool):
        if isinstance(value, bool):
            return value
        raise ConfigError(key, value, "true or false")
    if isinstance(default, int):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(key, value, "an integer")
    if isinstance(default, float):
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
        raise ConfigError(key, value, "a finite number")
    if isinstance(value, str):
        return value
    raise ConfigError(key, value, "a string")


def parse_config(run_config: Mapping[str, Any]) -> Config:
    """Build a validated :class:`Config` from Flower's flat run config.

    Raises :class:`ConfigError` on the first unknown key or invalid value. Keys
    missing from ``run_config`` keep their defaults.
    """
    defaults = Config().to_dict()
    values: dict[str, Any] = {}
    for key, value in run_config.items():
        if key not in defaults:
            raise ConfigError(key, value, "a known key: " + ", ".join(sorted(defaults)))
        value = _coerce(key, value, defaults[key])
        predicate, allowed = _CHECKS.get(key, (lambda _v: True, ""))
        if not predicate(value):
            raise ConfigError(key, value, allowed)
        values[key] = value
    merged = {**defaults, **values}
    config = _build(merged)
    _check_cross_field(config)
    return config


@functools.lru_cache(maxsize=8)
def _parse_items(items: frozenset) -> Config:
    return parse_config(dict(items))


def parse_config_cached(run_config: Mapping[str, Any]) -> Config:
    """:func:`parse_config`, once per process and content (clients see the same run config every message)."""
    return _parse_items(frozenset(run_config.items()))


def _groups() -> dict[str, type]:
    """Config's nested groups (``model``, ``data``, ``mask``, ...) by name, from its dataclass fields."""
    defaults = Config()
    return {
        f.name: type(getattr(defaults, f.name))
        for f in dataclasses.fields(Config)
        if dataclasses.is_dataclass(getattr(defaults, f.name))
    }


def _build(flat: dict[str, Any]) -> Config:
    groups = _groups()
    values: dict[str, dict[str, Any]] = {name: {} for name in groups}
    top: dict[str, Any] = {}
    for key, value in flat.items():
        prefix, _, rest = key.partition(".")
        if rest:
            values[prefix][rest.replace("-", "_")] = value
        else:
            top[key.replace("-", "_")] = value
    return Config(**top, **{name: cls(**values[name]) for name, cls in groups.items()})


def _only_with_strategy(config: Config, group: str, strategy: str) -> None:
    """Settings of ``group`` must keep their defaults unless the run uses ``strategy`` (no silent ignore)."""
    if config.strategy == strategy:
        return
    settings = getattr(config, group)
    for f in dataclasses.fields(settings):
        value = getattr(settings, f.name)
        if value != f.default:
            raise ConfigError(f"{group}.{_hyphen(f.name)}", value, f"its default unless strategy='{strategy}'")


def _only_when_enabled(config: Config, group: str, switch: str = "enabled", on: str = "true") -> None:
    """Settings of ``group`` must keep their defaults while the group is off (no silent ignore); ``switch`` is
    the field that turns it on (``<group>.enabled = true``, or e.g. ``dp.mode`` set)."""
    settings = getattr(config, group)
    if settings.enabled:
        return
    for f in dataclasses.fields(settings):
        value = getattr(settings, f.name)
        if f.name != switch and value != f.default:
            raise ConfigError(f"{group}.{_hyphen(f.name)}", value, f"its default unless {group}.{switch} = {on}")


def _check_cross_field(config: Config) -> None:
    _only_with_strategy(config, "mask", "masked-fedsgd")
    _only_with_strategy(config, "fedwavg", "fedwavg")
    _only_with_strategy(config, "fedprox", "fedprox")
    _only_with_strategy(config, "scaffold", "scaffold")
    _only_when_enabled(config, "adversarial")
    _only_when_enabled(config, "robust")
    if config.robust.attack != "autoattack":  # AutoAttack's own settings are not silently ignored under PGD
        for name in ("version", "every"):
            value, default = getattr(config.robust, name), getattr(RobustConfig, name)
            if value != default:
                raise ConfigError(f"robust.{name}", value, "its default unless robust.attack = 'autoattack'")
    if config.dp.enabled and config.strategy not in DP_STRATEGIES:
        raise ConfigError("dp.mode", config.dp.mode, f"'off' with strategy={config.strategy!r} (DP supports "
                          f"{', '.join(DP_STRATEGIES)}: one plain update per client)")  # fmt: skip
    _only_when_enabled(config, "dp", switch="mode", on="'central' or 'local'")
    if config.dp.canaries and config.dp.mode != "central":
        raise ConfigError("dp.canaries", config.dp.canaries, "0 unless dp.mode = 'central' (canaries join the server's "
                          "aggregate before its noise)")  # fmt: skip
    if config.dp.canaries and config.resume_from:
        raise ConfigError("dp.canaries", config.dp.canaries, "0 with resume-from (the estimate needs the run's start)")
    _only_when_enabled(config, "secagg")
    if config.secagg.enabled:
        _check_secagg(config)
    if config.lr_decay > 0 and config.strategy in SERVER_LR_STRATEGIES:
        raise ConfigError("lr-decay", config.lr_decay, f"0 with strategy={config.strategy!r} (its lr is the server's)")
    if config.encryption.enabled:
        _check_encryption(config)
    if (config.capture.enabled or config.capture.ground_truth) and not config.run_name:
        raise ConfigError("run-name", "", "a name when capture is on (clients write to <out-dir>/<run-name>/)")
    if config.capture.ground_truth and not config.capture.enabled:
        raise ConfigError("capture.ground-truth", True, "false unless capture.enabled = true")
    data = config.data
    if data.name == "synthetic" and data.partitioner == "noniid-k":
        if data.classes_per_client > data.synthetic_num_classes:
            raise ConfigError(
                "data.classes-per-client",
                data.classes_per_client,
                f"at most the number of classes ({data.synthetic_num_classes})",
            )


def _check_secagg(config: Config) -> None:
    """What SecAgg+ cannot compose with, refused with one line each."""
    if config.strategy not in SECAGG_STRATEGIES:
        raise ConfigError("strategy", config.strategy, f"{' or '.join(SECAGG_STRATEGIES)} with secagg.enabled: "
                          f"{SECAGG_REFUSALS[config.strategy]}")  # fmt: skip
    if config.encryption.enabled:
        raise ConfigError("encryption.mode", config.encryption.mode, "'off' with secagg.enabled: encrypted-domain "
                          "aggregation runs its key handshake and strategies through the Message API, SecAgg+ runs "
                          "Flower's legacy FedAvg")  # fmt: skip
    if config.dp.canaries:
        raise ConfigError("dp.canaries", config.dp.canaries, "0 with secagg.enabled (canaries join the aggregate in "
                          "fedvit's Message-API DP wrapper; SecAgg+ runs Flower's legacy one)")  # fmt: skip
    if config.resume_from:
        raise ConfigError("resume-from", config.resume_from, "'' with secagg.enabled (a SecAgg+ run starts afresh)")
    shares, threshold = config.secagg.num_shares, config.secagg.reconstruction_threshold
    if shares > 1 and threshold > 1 and threshold >= shares:
        raise ConfigError("secagg.reconstruction-threshold", threshold, f"less than secagg.num-shares ({shares:g})")


def _check_encryption(config: Config) -> None:
    mode = config.encryption.mode
    if config.strategy in ("fedprox", "scaffold"):
        raise ConfigError("strategy", config.strategy, "fedsgd, fedavg, masked-fedsgd or fedwavg with encryption")
    if config.dp.enabled:
        raise ConfigError(
            "dp.mode",
            config.dp.mode,
            f"'off' with encryption.mode={mode!r}: Flower's DP mods clip the update as it leaves the client, where "
            "it is encrypted and E_a changes its norm (the bound would not hold for the plain model)",
        )
    if config.centralized_evaluation:
        raise ConfigError(
            "centralized-evaluation",
            True,
            f"false with encryption.mode={mode!r}: the server holds only an "
            "encrypted model and no key (evaluation is federated: clients decrypt and evaluate)",
        )
    if config.strategy == "masked-fedsgd":
        if effective_rates([PATCH_EMBED_WEIGHT], config.mask)[PATCH_EMBED_WEIGHT] > 0:
            raise ConfigError(
                "mask.r-patch-embed",
                config.mask.r_patch_embed,
                "0 with encryption: eq. 12 divides entry by "
                "entry, which does not commute with E_a's mixing of the patch-embedding rows",
            )


def defence_of(config: Config) -> str:
    """A short public label of the defence a run config uses ("none" where none is on; another app's captures are
    labelled by ``fedvit.observed.observation.Defence``)."""
    parts = []
    if config.strategy == "masked-fedsgd":
        m = config.mask
        parts.append("fixed-position" if m.mode == "fixed-position" else f"mask-{m.mode}-r{m.r:g}")
    if config.encryption.enabled:
        parts.append(f"encryption-{config.encryption.mode}")
    if config.dp.enabled:
        parts.append(f"dp-{config.dp.mode}-σ{config.dp.noise_multiplier:g}-C{config.dp.clipping_norm:g}")
    if config.secagg.enabled:
        parts.append("secagg+")
    if config.adversarial.enabled:
        parts.append("pgd-at")
    return "+".join(parts) or "none"


def autoattack_in(config: Config, server_round: int) -> bool:
    """Whether round ``server_round`` is also evaluated under AutoAttack: every ``robust.every``-th and the last
    (never round 0, the untrained model)."""
    robust = config.robust
    if not (robust.enabled and robust.attack == "autoattack"):
        return False
    return server_round > 0 and (server_round % robust.every == 0 or server_round == config.num_server_rounds)


def evaluates_in(config: Config, server_round: int) -> bool:
    """Whether round ``server_round`` is evaluated: round 0, every ``eval-every``-th round and the last."""
    return server_round % config.eval_every == 0 or server_round == config.num_server_rounds


def check_against_federation(config: Config, num_clients: int, num_train: int, num_classes: int) -> None:
    """Checks that need the dataset size and the number of clients (run before training)."""
    data = config.data
    if data.partitioner == "noniid-k" and data.classes_per_client > num_classes:
        raise ConfigError(
            "data.classes-per-client", data.classes_per_client, f"at most the number of classes ({num_classes})"
        )
    if num_clients > num_train:
        raise ConfigError("num-partitions", num_clients, f"at most the number of training samples ({num_train})")
