"""The audit's one seam to a model: what to build, the input it takes, how pixels are normalised, its loss.

A :class:`ModelSpec` names a user factory (``package.module:callable``, called with the spec's ``args`` as keyword
arguments, returning the ``nn.Module`` the app trains), a timm model name (``args`` go to ``timm.create_model``),
or fedvit's own timm ViT (``builder``: :func:`fedvit.audit.fedvit_run.fedvit_spec`, from a run config's
``model.*``). The attacks build every model through a spec. ``fedvit audit`` makes the spec from its flags and
``fedvit-audit.toml``.
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported where a model is built, so `fedvit --help` never loads it
    from torch import nn

# Both losses are cross-entropy on the model's output: log_softmax of log-probabilities is the identity, so the
# attack's simulated loss, softmax(y)·log_softmax(output), equals NLL for a model that ends in log_softmax.
LOSSES = ("cross-entropy", "nll")


class SpecError(ValueError):
    """A model spec that cannot describe or build the attacked model."""


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """The attacked model and its input (see the module docstring)."""

    factory: str
    input_shape: tuple[int, int, int] = (3, 32, 32)
    mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    std: tuple[float, ...] = (0.5, 0.5, 0.5)
    loss: str = "cross-entropy"
    app_dir: str | None = None
    num_classes: int | None = None
    args: tuple[tuple[str, Any], ...] = ()  # keyword arguments of the factory (``get_model(num_classes=10)``)
    first_block: str = "pre-ln"  # fedvit's ``model.first-block`` ("no-ln": its first block without LayerNorm)
    stated: bool = True  # mean and std as the user gave them (False: the defaults, checked against the app's code)
    builder: Callable[[], nn.Module] | None = dataclasses.field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.loss not in LOSSES:
            raise SpecError(f"loss {self.loss!r} is not supported (one of {', '.join(LOSSES)})")
        if len(self.input_shape) != 3 or min(self.input_shape) < 1:
            raise SpecError(f"input must be [C, H, W] with positive sizes, got {list(self.input_shape)}")
        channels = self.input_shape[0]
        if len(self.mean) != channels or len(self.std) != channels:
            raise SpecError(f"mean and std need {channels} values (one per channel), got {self.mean} / {self.std}")
        if min(self.std) <= 0:
            raise SpecError(f"std must be positive, got {self.std}")

    def build(self, num_classes: int | None = None) -> nn.Module:
        """A fresh model (its weights are replaced by the captured ones), with the spec's mean/std attached where
        :func:`~fedvit.core.model.normalize` reads them.
        ``num_classes`` sizes a timm model's head unless the spec says."""
        if self.builder is not None:
            model = self.builder()
        elif ":" in self.factory:
            model = self._from_factory()
        else:
            model = self._from_timm(self.num_classes or num_classes)
        from torch import nn

        if not isinstance(model, nn.Module):
            raise SpecError(f"{self.factory} returned {type(model).__name__}, not a torch nn.Module")
        model.pretrained_cfg = {**(getattr(model, "pretrained_cfg", None) or {}), "mean": self.mean, "std": self.std}
        return model

    def _from_factory(self) -> nn.Module:
        factory = import_callable(self.factory, self.app_dir, "--model")
        try:
            return factory(**dict(self.args))
        except TypeError as err:  # a missing or unexpected argument: say how to give them
            given = ", ".join(f"{k}={v!r}" for k, v in self.args) or "no arguments"
            raise SpecError(f"--model {self.factory} called with {given}: {err} (give --model-arg KEY=VALUE)") from err

    def _from_timm(self, num_classes: int | None) -> nn.Module:
        import timm

        if not timm.is_model(self.factory):
            raise SpecError(f"{self.factory!r} is neither package.module:callable nor a timm model name")
        kwargs: dict[str, Any] = {"pretrained": False, "in_chans": self.input_shape[0], **dict(self.args)}
        if num_classes is not None:
            kwargs["num_classes"] = num_classes
        try:  # ViTs take the image size; CNNs refuse the argument
            return timm.create_model(self.factory, img_size=self.input_shape[1:], **kwargs)
        except TypeError:
            return timm.create_model(self.factory, **kwargs)

    def describe(self) -> str:
        c, h, w = self.input_shape
        called = f"({', '.join(f'{k}={v!r}' for k, v in self.args)})" if self.args else ""
        return (
            f"{self.factory}{called} on {c}×{h}×{w} inputs, normalised with mean {list(self.mean)} and std "
            f"{list(self.std)}, {self.loss} loss"
        )


def import_callable(reference: str, app_dir: str | None, flag: str) -> Callable[..., Any]:
    """``package.module:name`` imported (``app_dir`` put on sys.path first), with one clear error naming
    ``flag`` when the module, the name or the call is missing."""
    module_name, _, attr = reference.partition(":")
    if app_dir:
        path = str(Path(app_dir).expanduser().resolve())
        if path not in sys.path:
            sys.path.insert(0, path)
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        hint = "" if app_dir else " (give --app-dir with the folder that holds it)"
        raise SpecError(f"cannot import {module_name!r} for {flag} {reference}: {err}{hint}") from err
    found: Any = module
    for part in attr.split("."):
        if not hasattr(found, part):
            raise SpecError(f"{module_name} has no {attr!r} ({flag} {reference})")
        found = getattr(found, part)
    if not callable(found):
        raise SpecError(f"{flag} {reference} is not callable")
    return found


def head_bias(model: nn.Module) -> str | None:
    """The bias of the model's last ``nn.Linear`` (the classifier, whose gradient gives the labels away)."""
    from torch import nn

    last = None
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) and module.bias is not None:
            last = f"{name}.bias"
    return last


def is_vit(model: nn.Module) -> bool:
    """Whether the model has a ViT's patch embedding and position embedding (APRIL's closed forms need them)."""
    names = dict(model.named_parameters())
    return "pos_embed" in names and "patch_embed.proj.weight" in names


# breaching's Inverting Gradients recipe in fedvit's units: TV 0.2 on a 0.5-std normalised scale is 0.4 here, its
# Gaussian start and its kept candidate (lowest total objective); it led on the CNN and ResNet-18 (peer tables)
OTHER_SETTINGS: dict[str, Any] = {"tv": 0.4, "init": "gaussian", "keep": "objective"}


def model_settings(model: nn.Module) -> tuple[dict[str, Any], str]:
    """The optimisation attack's TV weight, start and kept candidate for ``model`` (AuditConfig fields) and why:
    AuditConfig's defaults (tuned on fedvit's ViTs) where the model has a ViT's embeddings, else
    :data:`OTHER_SETTINGS`."""
    from fedvit.core.budget import AuditConfig

    if is_vit(model):
        defaults = AuditConfig()
        return {key: getattr(defaults, key) for key in OTHER_SETTINGS}, "tuned on ViTs"
    return dict(OTHER_SETTINGS), "breaching's recipe, which led on a CNN and a ResNet-18; not a ViT"
