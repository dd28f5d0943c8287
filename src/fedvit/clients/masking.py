"""The client's random binary weights (random-binary-weights paper, eq. 11): fresh, locked or fixed-position masks
drawn from its private seed. The math the server shares (rates, wire encoding) is in :mod:`fedvit.core.masks`."""

from __future__ import annotations

import hashlib
import json
import secrets

import numpy as np
from safetensors.numpy import load_file

from fedvit.clients.state import PRIVATE, state_dir
from fedvit.core.masks import fixed_position_rates
from fedvit.core.results import atomic_save_safetensors, atomic_write


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
        atomic_write(path, str(secrets.randbits(63)).encode(), mode=PRIVATE)  # the server must not read it
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
        atomic_save_safetensors(path, cache, mode=PRIVATE)
    return {n: np.unpackbits(cache[n], count=int(np.prod(s))).astype(bool) for n, s in shapes.items()}
