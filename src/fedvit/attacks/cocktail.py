"""Batch attack on the patch embedding: unmix a whole batch's patches with independent component analysis.

The patch embedding is a linear layer applied to every patch, so its weight gradient is a sum of rank-one terms,
∂L/∂W_E = Σ_{b,s} G_s^(b) x_s^(b)ᵀ = A S (A: [D, K] the token gradients, S: [K, L] the patches, K = B·N): a
mixture of K "speakers" heard through D "microphones" (Cocktail Party Attack, Kariyappa et al. 2023). While
K ≤ rank ∂L/∂W_E ≤ min(D, L) — and ≤ D − 1 in pre-LN ViTs, where every token gradient sums to 0 — ICA recovers
each patch up to scale and sign (sklearn's FastICA). The position-embedding gradient, Σ_b G_s^(b) per position
s, then fixes both: solving Â C = ∂L/∂posᵀ gives C[j, s] = 1/α_j exactly for the position s of source j, which
places every patch and undoes its scale. Patches of the same position are dealt to the B images by a
smoothness prior (Hungarian matching on the borders with their already placed neighbours).
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import linear_sum_assignment

from fedvit.attacks.april import EPS_RANK, lstsq, patches_to_image
from fedvit.core.params import PATCH_EMBED_WEIGHT, POS_EMBED
from fedvit.observed.observation import Observation, Reconstruction, first_block, image_geometry, recipe


def batch_bound(d: int, l_dim: int, n: int, pre_ln: bool) -> int:
    """The largest batch whose B·N patches the layer's gradient can hold apart: rank ≤ min(D(−1), L)."""
    return min(d - 1 if pre_ln else d, l_dim) // n


def cocktail_party(obs: Observation, seed: int = 0) -> Reconstruction:
    """All B images of a FedSGD batch from ∂L/∂W_E and ∂L/∂pos (see the module docstring)."""
    rec = recipe(obs)
    if not rec.sends_gradient:
        return Reconstruction(None, "needs a gradient update (FedSGD); a FedAvg update mixes several steps")
    if obs.masks is not None and not (obs.masks[PATCH_EMBED_WEIGHT].all() and obs.masks[POS_EMBED].all()):
        return Reconstruction(None, "the mask hides part of the patch- or position-embedding gradient")
    if not obs.update[POS_EMBED].any():
        return Reconstruction(None, "no position-embedding gradient in the payload")
    d, l_dim = obs.update[PATCH_EMBED_WEIGHT].reshape(obs.update[PATCH_EMBED_WEIGHT].shape[0], -1).shape
    n = obs.update[POS_EMBED].shape[1] - 1
    bound = batch_bound(d, l_dim, n, first_block(obs) == "pre-ln")
    if rec.batch > bound:
        return Reconstruction(
            None, f"B·N = {rec.batch * n} patches > rank bound {bound * n} (D={d}, L={l_dim}): B ≤ {bound}"
        )
    patches, position, sharpness = unmix_patches(obs, rec.batch, seed)
    images = assemble(patches, position, rec.batch, obs)
    note = f"{len(patches)} patches unmixed (bound B ≤ {bound}); position evidence best/second {sharpness:.1f}×"
    return Reconstruction(images[0], note, images=tuple(images))


def unmix_patches(obs: Observation, batch: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, float]:
    """The B·N patches [K, L] (normalised), the position of each, and how clearly the positions stood out (mean
    ratio of the best to the second-best position coefficient)."""
    from sklearn.decomposition import FastICA

    pos = obs.update[POS_EMBED][0].astype(np.float64)
    m = obs.update[PATCH_EMBED_WEIGHT].astype(np.float64)
    m = m.reshape(m.shape[0], -1)
    n = pos.shape[0] - 1
    k = batch * n
    scale = np.abs(m).max()
    ica = FastICA(n_components=k, whiten="unit-variance", random_state=seed, max_iter=2000, tol=1e-6)
    sources = ica.fit_transform(m.T / scale).T  # [K, L], zero-mean per source
    mixing = ica.mixing_ * scale  # [D, K]
    sources = sources + lstsq(mixing, ica.mean_ * scale)[:, None]  # the DC each source lost to centring
    coef = lstsq(mixing, pos[1:].T)  # [K, N]: 1/α_j at the source's position, ~0 elsewhere
    strength = np.abs(coef) / np.abs(coef).max(axis=1, keepdims=True)
    slots = np.repeat(np.arange(n), batch)  # each position holds B patches
    rows, cols = linear_sum_assignment(-strength[:, slots])
    position = np.empty(k, np.int64)
    position[rows] = slots[cols]
    patches = sources / coef[np.arange(k), position][:, None]  # x_k = ŝ_j · α_j
    second = np.sort(strength, 1)[:, -2] if n > 1 else np.full(k, EPS_RANK)
    return patches, position, float(np.mean(strength.max(1) / np.maximum(second, EPS_RANK)))


def assemble(patches: np.ndarray, position: np.ndarray, batch: int, obs: Observation) -> list[np.ndarray]:
    """Deal each position's B patches to B images, in raster order, minimising the border mismatch with the
    left and upper neighbours already placed (Hungarian assignment per position)."""
    c, h, w, p = image_geometry(obs)
    gw = w // p
    n = h // p * gw
    placed = np.zeros((batch, n, patches.shape[1]))
    for s in range(n):
        group = patches[position == s][:batch]
        if len(group) < batch:  # an unassigned slot: fill with the mean patch of the group (or zeros)
            fill = group.mean(0) if len(group) else np.zeros(patches.shape[1])
            group = np.concatenate([group, np.repeat(fill[None], batch - len(group), 0)])
        cost = np.zeros((batch, batch))
        neighbours = ([(s - 1, "left")] if s % gw else []) + ([(s - gw, "up")] if s >= gw else [])
        for neighbour, edge in neighbours:
            for i in range(batch):
                for j in range(batch):
                    cost[i, j] += border_gap(placed[i, neighbour], group[j], edge, c, p)
        rows, cols = linear_sum_assignment(cost)
        placed[rows, s] = group[cols]
    return [patches_to_image(placed[i], obs) for i in range(batch)]


def border_gap(before: np.ndarray, patch: np.ndarray, edge: str, c: int, p: int) -> float:
    """Squared difference across the shared border of a patch and its left (or upper) neighbour."""
    a, b = before.reshape(c, p, p), patch.reshape(c, p, p)
    if edge == "left":
        return float(((a[:, :, -1] - b[:, :, 0]) ** 2).sum())
    return float(((a[:, -1, :] - b[:, 0, :]) ** 2).sum())
