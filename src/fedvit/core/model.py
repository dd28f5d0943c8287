"""timm ViT factory, input normalisation and parameter lookup by role (names and roles: fedvit.core.params)."""

from __future__ import annotations

import os
import types
from collections import OrderedDict

import numpy as np
import timm
import torch
from torch import nn

from fedvit.core.config import ConfigError, ModelConfig
from fedvit.core.params import HEAD_BIAS, PARAM_ROLES, VIS_HEAD

# model.head -> timm's global_pool: the class token, or the mean of the visual (patch) tokens.
GLOBAL_POOL = {"cls": "token", "vis": "avg", "cls+vis": "token"}


class PretrainedWeightsError(RuntimeError):
    """Pretrained weights were requested but could not be obtained."""


def role_params(model: nn.Module, role: str) -> list[str]:
    """Names of the parameters that play ``role`` in ``model`` (see :data:`PARAM_ROLES`).

    Raises ``KeyError`` for an unknown role and ``ValueError`` when the model has
    none of the role's parameters (e.g. a model without a position embedding).
    """
    names = dict(model.named_parameters())
    found = [n for n in PARAM_ROLES[role] if n in names]
    if not found:
        raise ValueError(f"model {type(model).__name__} has no parameter for role {role!r} ({PARAM_ROLES[role]})")
    return found


def _overrides(cfg: ModelConfig) -> dict[str, int]:
    values = {
        "img_size": cfg.img_size,
        "patch_size": cfg.patch_size,
        "embed_dim": cfg.embed_dim,
        "depth": cfg.depth,
        "num_heads": cfg.num_heads,
    }
    return {k: v for k, v in values.items() if v}


class NoLNFirstBlock(nn.Module):
    """APRIL's "architecture A" first block: x = attn(x); x = mlp(norm2(x)) — no norm1, no residuals.

    The embedding z0 feeds attention directly, the setting of APRIL's closed form (and of breaching's
    ``ModifiedBlock``). Parameter names stay ``blocks.0.attn.*``, ``blocks.0.norm2.*``, ``blocks.0.mlp.*``.
    """

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.attn, self.norm2, self.mlp = block.attn, block.norm2, block.mlp

    def forward(self, x: torch.Tensor, **_: object) -> torch.Tensor:
        return self.mlp(self.norm2(self.attn(x)))


def _cls_vis_forward_head(self: nn.Module, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
    """CLS+VIS head (FedWAvg paper, Sec. 3.2): a linear head on the class token plus a linear head on the mean
    of the visual tokens, logits summed. (The paper's VIS pooling follows So-ViT's second-order cross-covariance
    pooling; fedvit uses first-order average pooling of the patch tokens, as timm's "avg" pool does.)"""
    cls_token, visual = x[:, 0], x[:, getattr(self, "num_prefix_tokens", 1) :].mean(dim=1)
    if pre_logits:
        return torch.cat([cls_token, visual], dim=-1)
    drop = getattr(self, "head_drop", nn.Identity())
    return self.head(drop(cls_token)) + getattr(self, VIS_HEAD)(drop(visual))


def build_model(cfg: ModelConfig, num_classes: int, seed: int = 0) -> nn.Module:
    """Create the timm model with the configured head; initialisation is seeded and leaves the global RNG untouched."""
    try:
        model = _create(cfg, num_classes, seed)
    except (TypeError, AssertionError) as err:  # timm's way of refusing an argument, e.g. a pool it lacks
        raise ConfigError(
            "model.head",
            cfg.head,
            f"a head that timm can build for {cfg.name!r} with the size overrides {_overrides(cfg)} "
            f"(timm refused global_pool={GLOBAL_POOL[cfg.head]!r}: {err})",
        ) from err
    if cfg.first_block == "no-ln":
        model.blocks[0] = NoLNFirstBlock(model.blocks[0])
    if cfg.head == "cls+vis":
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed + 1)
            setattr(model, VIS_HEAD, nn.Linear(model.head.in_features, num_classes))
        model.forward_head = types.MethodType(_cls_vis_forward_head, model)
    return model


def _create(cfg: ModelConfig, num_classes: int, seed: int) -> nn.Module:
    kwargs: dict = dict(num_classes=num_classes, global_pool=GLOBAL_POOL[cfg.head], **_overrides(cfg))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if cfg.pretrained == "off":
            return timm.create_model(cfg.name, pretrained=False, **kwargs)
        if cfg.pretrained == "hub":
            try:
                return timm.create_model(cfg.name, pretrained=True, **kwargs)
            except Exception as err:  # network / hub errors come in many types
                raise PretrainedWeightsError(
                    f"could not fetch pretrained weights for {cfg.name!r} from the timm hub ({type(err).__name__}: "
                    f"{err}). Offline? Download them on a connected machine (timm.create_model("
                    f"{cfg.name!r}, pretrained=True) and save_file(model.state_dict(), 'weights.safetensors')) "
                    "and set model.pretrained='/abs/path/weights.safetensors'"
                ) from err
        path = os.path.abspath(os.path.expanduser(cfg.pretrained))
        if not os.path.isfile(path):
            raise PretrainedWeightsError(
                f"model.pretrained={cfg.pretrained!r}: no such file; expected 'off', 'hub' or a "
                ".safetensors/.pth/.npz weights file"
            )
        # timm's own loader adapts the checkpoint: it resamples pos_embed to the
        # new grid and drops the head when the file's class count differs from ours.
        overlay = {"file": path, "num_classes": _head_classes(path)}
        return timm.create_model(cfg.name, pretrained=True, pretrained_cfg_overlay=overlay, **kwargs)


def _head_classes(path: str) -> int:
    """Rows of the classifier head stored in a weights file (1000 for ImageNet checkpoints)."""
    from timm.models import load_state_dict

    head = load_state_dict(path).get(HEAD_BIAS)
    return int(head.shape[0]) if head is not None else 0


def normalize(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Map pixels in [0, 1] to the model's input statistics (attacks perturb before this)."""
    cfg = getattr(model, "pretrained_cfg", {}) or {}
    mean = torch.tensor(cfg.get("mean", (0.5, 0.5, 0.5)), device=x.device, dtype=x.dtype).view(1, -1, 1, 1)
    std = torch.tensor(cfg.get("std", (0.5, 0.5, 0.5)), device=x.device, dtype=x.dtype).view(1, -1, 1, 1)
    return (x - mean) / std


def classify(model: nn.Module, pixels: torch.Tensor) -> torch.Tensor:
    """Logits for images with pixels in [0, 1]."""
    return model(normalize(model, pixels))


def get_weights(model: nn.Module) -> OrderedDict[str, np.ndarray]:
    """Trainable parameters by name as float32 numpy arrays (copies)."""
    return OrderedDict(
        (name, p.detach().to("cpu", torch.float32).numpy().copy()) for name, p in model.named_parameters()
    )


def set_weights(model: nn.Module, weights: dict[str, np.ndarray]) -> None:
    """Copy named arrays into the model's parameters in place; names and shapes must match."""
    params = dict(model.named_parameters())
    missing = set(params) - set(weights)
    extra = set(weights) - set(params)
    if missing or extra:
        raise ValueError(f"weights do not match the model: missing {sorted(missing)}, unexpected {sorted(extra)}")
    with torch.no_grad():
        for name, p in params.items():
            value = torch.as_tensor(weights[name])
            if value.shape != p.shape:
                raise ValueError(f"{name}: shape {tuple(value.shape)} does not match the model's {tuple(p.shape)}")
            p.copy_(value)


def resolve_device(name: str) -> torch.device:
    """'auto' picks CUDA when available; asking for CUDA without one is an error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device='cuda' requested but torch.cuda.is_available() is False")
    return torch.device(name)
