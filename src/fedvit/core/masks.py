"""Random-binary-weights vocabulary shared by clients and server (random-binary-weights paper, eqs. 11-12):
the mask spec, P(B = 0) per parameter, and the sparse wire encoding of a masked update."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

import numpy as np

from fedvit.core.params import PARAM_ROLES


@dataclass(frozen=True)
class MaskConfig:
    """Random binary weights (strategy masked-fedsgd); R = P(B = 0), role overrides < 0 mean "use r"."""

    mode: str = "fresh"
    r: float = 0.5
    r_pos_embed: float = -1.0
    r_patch_embed: float = -1.0
    r_patterns: str = ""  # "blocks.0.*=0.9; head.*=0.1" (fnmatch on parameter names, last match wins)


def parse_patterns(text: str) -> tuple[tuple[str, float], ...]:
    """``"blocks.0.*=0.9; head.*=0.1"`` -> ((pattern, R), ...); raises ValueError with the bad item."""
    out = []
    for item in filter(None, (part.strip() for part in text.split(";"))):
        pattern, sep, value = item.partition("=")
        try:
            r = float(value)
        except ValueError:
            r = float("nan")
        if not sep or not pattern.strip() or not 0.0 <= r <= 1.0:
            raise ValueError(f"{item!r} is not '<name pattern>=<R in [0, 1]>'")
        out.append((pattern.strip(), r))
    return tuple(out)


def mask_rates(names: list[str], spec: MaskConfig) -> dict[str, float]:
    """R per parameter: the default, then the role overrides, then name patterns (the last match wins)."""
    roles = {name: role for role, role_names in PARAM_ROLES.items() for name in role_names}
    rates = {}
    for name in names:
        r = spec.r
        if roles.get(name) == "position-embedding" and spec.r_pos_embed >= 0:
            r = spec.r_pos_embed
        if roles.get(name) == "patch-embedding" and spec.r_patch_embed >= 0:
            r = spec.r_patch_embed
        for pattern, value in parse_patterns(spec.r_patterns):
            if fnmatch.fnmatchcase(name, pattern):
                r = value
        rates[name] = r
    return rates


def fixed_position_rates(names: list[str]) -> dict[str, float]:
    """The fixed-position defence (APRIL paper) as rates: R = 1 for the position embedding, 0 elsewhere."""
    pos = set(PARAM_ROLES["position-embedding"])
    return {name: 1.0 if name in pos else 0.0 for name in names}


def effective_rates(names: list[str], spec: MaskConfig) -> dict[str, float]:
    """P(B = 0) per parameter for any mode."""
    return fixed_position_rates(names) if spec.mode == "fixed-position" else mask_rates(names, spec)


def encode(
    gradients: dict[str, np.ndarray], masks: dict[str, np.ndarray]
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """θ' = B·θ sent sparsely: the kept values (float32, flattened order) and the mask bit-packed."""
    values = {name: np.ascontiguousarray(g.reshape(-1)[masks[name]], dtype=np.float32) for name, g in gradients.items()}
    packed = {name: np.packbits(masks[name]) for name in gradients}
    return values, packed


def decode(values: np.ndarray, packed: np.ndarray, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Dense masked gradient and boolean mask from one parameter's encoding; ValueError if inconsistent."""
    size = int(np.prod(shape))
    if packed.dtype != np.uint8 or packed.ndim != 1 or len(packed) != (size + 7) // 8:
        raise ValueError(f"mask has {packed.dtype} {packed.shape}, expected uint8 ({(size + 7) // 8},)")
    mask = np.unpackbits(packed, count=size).astype(bool)
    if np.unpackbits(packed)[size:].any():
        raise ValueError("mask padding bits are set")
    kept = int(mask.sum())
    if values.ndim != 1 or len(values) != kept:
        raise ValueError(f"{values.shape} values sent for {kept} kept entries")
    dense = np.zeros(size, dtype=np.float32)
    dense[mask] = values
    return dense.reshape(shape), mask.reshape(shape)
