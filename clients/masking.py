"""Random binary weights on client gradients (random-binary-weights paper, eq. 11) and their sparse encoding."""

from __future__ import annotations

import fnmatch
import hashlib
import json
import secrets

import numpy as np
from safetensors.numpy import load_file

from clients.state import state_dir
from fedvit_app.config import MaskConfig, parse_patterns
from fedvit_app.model import PARAM_ROLES
from fedvit_app.results import atomic_save_safetensors, atomic_write


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


def draw_masks(
    shapes: dict[str, tuple[int, ...]], rates: dict[str, float], seed: int, stream: int
) -> dict[str, np.ndarray]:
    """B ∈ {0, 1} per entry with P(B = 0) = R (eq. 11), from a generator seeded by (client seed, stream).

    ``stream`` is the round for fresh masks and 0 for locked ones.
    """
    rng = np.random.default_rng([seed, stream])
    masks = {}
    for name, shape in shapes.items():
        # One uniform draw per entry keeps P(B=0) = R exactly for any R, and the
        # stream position of every parameter independent of the others' R.
        masks[name] = rng.random(int(np.prod(shape)), dtype=np.float32) >= rates[name]
    return masks


def fixed_position_masks(shapes: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    """The fixed-position defence as a mask: the position-embedding gradient is zeroed, nothing else."""
    rates = fixed_position_rates(list(shapes))
    return {name: np.full(int(np.prod(shape)), rates[name] == 0.0) for name, shape in shapes.items()}


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


# --------------------------------------------------------------------------- client-local state


def client_seed(partition_id: int, node_seed: int | None = None) -> int:
    """The client's private mask seed: ``mask-seed`` from node config, else a random one kept on disk.

    The server never sends or sees it, so it cannot predict the masks; keeping it
    on disk makes a client's masks reproducible across runs and restarts.
    """
    if node_seed is not None:
        return int(node_seed)
    path = state_dir(partition_id) / "mask-seed"
    if not path.exists():
        atomic_write(path, str(secrets.randbits(63)).encode())
    return int(path.read_text())


def locked_masks(
    partition_id: int,
    seed: int,
    shapes: dict[str, tuple[int, ...]],
    rates: dict[str, float],
    cache: dict[str, np.ndarray] | None = None,
) -> dict[str, np.ndarray]:
    """The client's locked masks, drawn once and reused every round.

    Looked up in ``cache`` (the client's Flower context state, packed), then in the
    on-disk copy that survives restarts, else drawn and stored in both. The file
    name hashes the shapes and rates, so a changed model or R never reuses a stale mask.
    """
    key = hashlib.sha256(json.dumps(sorted((n, list(s), rates[n]) for n, s in shapes.items())).encode()).hexdigest()
    path = state_dir(partition_id) / f"locked-mask-{key[:16]}.safetensors"
    if cache is None:
        cache = {}
    if not cache and path.exists():
        cache.update(load_file(str(path)))
    if not cache:
        masks = draw_masks(shapes, rates, seed, stream=0)
        cache.update({n: np.packbits(m) for n, m in masks.items()})
        atomic_save_safetensors(path, cache)
    return {n: np.unpackbits(cache[n], count=int(np.prod(s))).astype(bool) for n, s in shapes.items()}
