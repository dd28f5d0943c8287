"""Closed-form gradient inversion of one ViT update at batch size 1 (APRIL and defence-aware variants).

Notation (as in the APRIL paper, arXiv 2112.14087): X [N, L] holds the (normalised) image's patches, one row per patch
in row-major grid order, each flattened in (channel, row, column) order; W_E = ``patch_embed.proj.weight``
reshaped [D, L]; G = ∂L/∂z0 = ``pos_embed.grad[0]`` [N+1, D] at batch size 1, G_p = G[1:].

- Embedding route ("APRIL-E"): ∂L/∂W_E = G_pᵀ X, so X = (G_pᵀ)⁺ ∂L/∂W_E — exact when
  rank G_p = N (N ≤ D−1 in pre-LN models, where every row of G sums to 0). Needs no attention or LayerNorm.
- Attention route (APRIL's closed form, §3.2): W_qkvᵀ ∂L/∂W_qkv = Gᵀ z0 when attention reads z0 directly
  (the no-LN first block, ``model.first-block = "no-ln"``); then z0 → X by inverting the patch embedding,
  minimum-norm when L > D. On timm's pre-LN block the identity does not hold and the route fails (§3.3).

All solves run in float64 with SVD-based least squares. Every attack takes only an :class:`Observation`.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from fedvit.core.params import PATCH_EMBED_BIAS, PATCH_EMBED_WEIGHT, POS_EMBED, QKV0_WEIGHT
from fedvit.observed.observation import Observation, Reconstruction, first_block, image_geometry, normalization

EPS_RANK = 1e-10  # relative singular-value cut-off for rank and least squares


def lstsq(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Minimum-norm least-squares solution of a x = b in float64 (LAPACK gelsd)."""
    return np.linalg.lstsq(np.asarray(a, np.float64), np.asarray(b, np.float64), rcond=EPS_RANK)[0]


def unpatchify(
    patches: np.ndarray, geometry: tuple[int, int, int, int], mean: np.ndarray, std: np.ndarray
) -> np.ndarray:
    """X [N, L] (normalised) → image [C, H, W] in [0, 1] for ``geometry`` (C, H, W, P): un-patchify,
    de-normalise, clamp."""
    c, h, w, p = geometry
    grid = patches.reshape(h // p, w // p, c, p, p).transpose(2, 0, 3, 1, 4).reshape(c, h, w)
    mean, std = np.asarray(mean, np.float64), np.asarray(std, np.float64)
    return np.clip(grid * std[:, None, None] + mean[:, None, None], 0.0, 1.0)


def patches_to_image(patches: np.ndarray, obs: Observation) -> np.ndarray:
    """:func:`unpatchify` with the observed model's geometry and normalisation."""
    return unpatchify(patches, image_geometry(obs), *normalization(obs))


def image_to_patches(image: np.ndarray, obs: Observation) -> np.ndarray:
    """Image [C, H, W] in [0, 1] → normalised X [N, L] (the inverse of :func:`patches_to_image` before clamping)."""
    c, h, w, p = image_geometry(obs)
    mean, std = normalization(obs)
    x = (np.asarray(image, np.float64) - mean[:, None, None]) / std[:, None, None]
    return x.reshape(c, h // p, p, w // p, p).transpose(1, 3, 0, 2, 4).reshape((h // p) * (w // p), c * p * p)


def _embedding_gradients(obs: Observation) -> tuple[np.ndarray, np.ndarray]:
    g = obs.update[POS_EMBED][0].astype(np.float64)
    dw = obs.update[PATCH_EMBED_WEIGHT]
    return g, dw.reshape(dw.shape[0], -1).astype(np.float64)


def patch_rows(obs: Observation, g: np.ndarray) -> np.ndarray:
    """G_p: the rows of the patch tokens (the class token's row, and any other prefix token, come first)."""
    _, h, w, p = image_geometry(obs)
    return g[g.shape[0] - (h // p) * (w // p) :]


def embedding_route_patches(obs: Observation) -> np.ndarray:
    """X = (G_pᵀ)⁺ ∂L/∂W_E (APRIL's embedding route), in the order and coordinates the payload uses."""
    g, dw = _embedding_gradients(obs)
    return lstsq(patch_rows(obs, g).T, dw)


def embedding_route(obs: Observation) -> Reconstruction:
    """APRIL-E: pixels from the position- and patch-embedding gradients (the real threat to a stock ViT)."""
    g, _ = _embedding_gradients(obs)
    gp = patch_rows(obs, g)
    if not np.any(gp):
        return Reconstruction(None, "no position-embedding gradient in the payload")
    rank = np.linalg.matrix_rank(gp, tol=EPS_RANK * np.abs(gp).max() * max(gp.shape))
    note = f"rank G_p = {rank} of N = {gp.shape[0]}"
    return Reconstruction(patches_to_image(embedding_route_patches(obs), obs), note)


def attention_route(obs: Observation) -> Reconstruction:
    """APRIL's closed form: Gᵀ z0 = W_qkvᵀ ∂L/∂W_qkv, then the minimum-norm inversion of the patch embedding.

    Exact (up to the minimum-norm projection when L > D) only on the no-LN first block; on timm's pre-LN
    block it is run anyway and fails, which is the point of reporting it.
    """
    if QKV0_WEIGHT not in obs.update:
        return Reconstruction(None, "no blocks.0.attn.qkv.weight gradient")
    g, _ = _embedding_gradients(obs)
    if not np.any(g):
        return Reconstruction(None, "no position-embedding gradient in the payload")
    w_qkv = obs.received[QKV0_WEIGHT].astype(np.float64)
    b = w_qkv.T @ obs.update[QKV0_WEIGHT].astype(np.float64)  # [D, D]
    z0 = lstsq(g.T, b)  # [N+1, D]
    w_e = obs.received[PATCH_EMBED_WEIGHT].astype(np.float64)
    w_e = w_e.reshape(w_e.shape[0], -1)  # [D, L]
    tokens = z0[1:] - obs.received[POS_EMBED][0, 1:] - obs.received[PATCH_EMBED_BIAS]  # = X W_Eᵀ
    patches = lstsq(w_e, tokens.T).T  # minimum-norm when L > D
    limit = "exact" if w_e.shape[1] <= w_e.shape[0] else f"minimum-norm (L={w_e.shape[1]} > D={w_e.shape[0]})"
    block = first_block(obs)
    return Reconstruction(patches_to_image(patches, obs), f"{block} first block; embedding inversion {limit}")


# ---------------------------------------------------------------------------- random binary masks


def masked_embedding_route(obs: Observation, max_evaluations: int = 60) -> Reconstruction:
    """Mask-aware APRIL-E: APRIL's embedding route on the equations whose entries survived the mask.

    Zeros on the wire reveal the mask, and the payload carries it anyway. If the position-embedding gradient
    is complete, every pixel column of X is solved from its surviving rows of ∂L/∂W_E (exact while at least N
    rows survive); otherwise X and the missing G_p entries are solved jointly (:func:`masked_joint_route`).
    """
    if obs.masks is None:
        return Reconstruction(None, "the payload carries no masks")
    g, dw = _embedding_gradients(obs)
    if obs.masks[POS_EMBED][0, 1:].all():
        dw_kept = obs.masks[PATCH_EMBED_WEIGHT].reshape(dw.shape).astype(bool)
        x = _solve_columns(g[1:], dw, dw_kept)
        return Reconstruction(patches_to_image(x, obs), "G_p complete: per-column least squares")
    return masked_joint_route(obs, max_evaluations)


def _solve_columns(gp: np.ndarray, dw: np.ndarray, kept: np.ndarray) -> np.ndarray:
    """X column by column from the surviving rows of ∂L/∂W_E = G_pᵀ X."""
    if kept.all():
        return lstsq(gp.T, dw)
    x = np.zeros((gp.shape[0], dw.shape[1]))
    patterns, which = np.unique(kept, axis=1, return_inverse=True)  # columns sharing a row pattern: one solve
    for k, pattern in enumerate(patterns.T):
        cols = np.flatnonzero(which.ravel() == k)
        x[:, cols] = lstsq(gp.T[pattern], dw[pattern][:, cols])
    return x


def fixed_position(obs: Observation) -> Reconstruction:
    """The fixed-position defence leaves no position-embedding gradient: route A and APRIL have no G.

    For pre-LN timm models no closed form is known; only optimisation attacks remain, which are
    out of this module's scope. Reported as "cannot run", not as a score.
    """
    return Reconstruction(None, "no position-embedding gradient (fixed position): no closed form for pre-LN ViTs")


# ---------------------------------------------------------------------------- embedding encryption


def known_plaintext_route(obs: Observation) -> Reconstruction:
    """Break embedding encryption with a plaintext/ciphertext pair of the initial embeddings.

    E_b: match each encrypted position row to the plain one (exact). E_a: Ŵ⁰ = W⁰ E_aᵀ gives
    M = (W⁰)⁺ Ŵ⁰, = E_aᵀ exactly when L ≤ D, else its projection onto W⁰'s row space. The embedding route on
    the encrypted update returns Y = Π X E_aᵀ; X = Πᵀ Y M⁺ (the minimum-norm estimate when L > D).
    """
    if obs.known_plaintext is None or obs.known_ciphertext is None:
        return Reconstruction(None, "no plaintext/ciphertext pair of the initial embeddings is known")
    pos0 = obs.known_plaintext[POS_EMBED][0].astype(np.float64)
    pos0_enc = obs.known_ciphertext[POS_EMBED][0].astype(np.float64)
    dist = ((pos0_enc[:, None, :] - pos0[None, :, :]) ** 2).sum(-1)
    perm = dist.argmin(1)  # (E_b E_pos)[i] = E_pos[perm[i]]
    w0 = obs.known_plaintext[PATCH_EMBED_WEIGHT]
    w0 = w0.reshape(w0.shape[0], -1).astype(np.float64)
    w0_enc = obs.known_ciphertext[PATCH_EMBED_WEIGHT].reshape(w0.shape).astype(np.float64)
    m = lstsq(w0, w0_enc)  # ≈ E_aᵀ
    y = embedding_route_patches(obs)  # rows in encrypted order
    x_enc_order = y @ np.linalg.pinv(m, rcond=EPS_RANK)
    x = np.zeros_like(x_enc_order)
    x[perm[1:] - 1] = x_enc_order
    exact = w0.shape[1] <= w0.shape[0]
    bijective = len(set(perm.tolist())) == len(perm)
    note = ("E_a exact" if exact else f"E_a minimum-norm (L={w0.shape[1]} > D={w0.shape[0]})") + (
        ", E_b exact" if bijective else ", E_b ambiguous"
    )
    return Reconstruction(patches_to_image(x, obs), note)


def masked_joint_route(obs: Observation, max_evaluations: int = 60, max_unknowns: int = 20_000) -> Reconstruction:
    """Mask-aware APRIL-E, joint solve: X and the missing G_p entries together by trust-region least squares
    (scipy ``least_squares``, sparse Jacobian, LSMR) on the surviving entries of ∂L/∂W_E = G_pᵀX and
    ∂L/∂b_E = G_pᵀ1, plus G·1 = 0 in pre-LN models; started from the per-column solve.

    Identifiable only while R·N·D + N·L ≤ (1−R)·D·(L+1) (the equation count); above it a perfect fit can be
    the wrong image. Refused (not run) when the unknowns exceed ``max_unknowns`` (the dense-ish Jacobian of a
    ViT-S/16 update needs far more than a CPU minute; see docs/results/audit.md).
    """
    from scipy.optimize import least_squares
    from scipy.sparse import coo_matrix

    if obs.masks is None:
        return Reconstruction(None, "the payload carries no masks")
    g, dw = _embedding_gradients(obs)
    gp0, missing = g[1:].copy(), ~obs.masks[POS_EMBED][0, 1:].astype(bool)
    dw_kept = obs.masks[PATCH_EMBED_WEIGHT].reshape(dw.shape).astype(bool)
    n, d_dim = gp0.shape
    length = dw.shape[1]
    if missing.all():
        return Reconstruction(None, "the whole position-embedding gradient was dropped: no equations for G")
    miss = np.flatnonzero(missing.ravel())
    m = len(miss)
    if m + n * length > max_unknowns:
        return Reconstruction(None, f"{m + n * length:,} unknowns > {max_unknowns:,}: joint solve not attempted")
    db = obs.update.get(PATCH_EMBED_BIAS)
    db_kept = obs.masks.get(PATCH_EMBED_BIAS, np.zeros(d_dim, bool)).astype(bool) if db is not None else None
    pre_ln = first_block(obs) == "pre-ln"
    eq_d, eq_j = np.nonzero(dw_kept)
    scale_w = 1.0 / max(np.sqrt(np.mean(dw[dw_kept] ** 2)), 1e-30)
    scale_g = 1.0 / max(np.sqrt(np.mean(gp0[~missing] ** 2)), 1e-30)
    miss_n, miss_d = np.unravel_index(miss, missing.shape)

    def unpack(u):
        gp = gp0.copy()
        gp.ravel()[miss] = u[:m]
        return gp, u[m:].reshape(n, length)

    def residual(u):
        gp, x = unpack(u)
        parts = [((gp.T @ x - dw)[dw_kept]) * scale_w]
        if db_kept is not None:
            parts.append((gp.sum(0) - db)[db_kept] * scale_g)
        if pre_ln:
            parts.append(gp.sum(1) * scale_g)
        return np.concatenate(parts)

    def jacobian(u):
        gp, x = unpack(u)
        e = len(eq_d)
        rows = [np.repeat(np.arange(e), n)]
        cols = [m + (np.arange(n)[None, :] * length + eq_j[:, None]).ravel()]
        vals = [gp[:, eq_d].T.ravel() * scale_w]
        order = np.argsort(eq_d, kind="stable")
        starts = np.searchsorted(eq_d[order], np.arange(d_dim + 1))
        for k in range(m):  # missing G entry (n_k, d_k) appears in every kept equation of row d_k
            eqs = order[starts[miss_d[k]] : starts[miss_d[k] + 1]]
            rows.append(eqs)
            cols.append(np.full(len(eqs), k))
            vals.append(x[miss_n[k], eq_j[eqs]] * scale_w)
        offset = e
        if db_kept is not None:
            bias_row = np.cumsum(db_kept) - 1
            sel = db_kept[miss_d]
            rows.append(offset + bias_row[miss_d[sel]])
            cols.append(np.flatnonzero(sel))
            vals.append(np.full(sel.sum(), scale_g))
            offset += int(db_kept.sum())
        if pre_ln:
            rows.append(offset + miss_n)
            cols.append(np.arange(m))
            vals.append(np.full(m, scale_g))
            offset += n
        return coo_matrix(
            (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(offset, m + n * length)
        ).tocsr()

    counts = missing.sum(1, keepdims=True)
    start_g = np.where(missing, -gp0.sum(1, keepdims=True) / np.maximum(counts, 1), gp0)
    start = np.concatenate([start_g.ravel()[miss], _solve_columns(start_g, dw, dw_kept).ravel()])
    fit = least_squares(
        residual,
        start,
        jac=jacobian,
        method="trf",
        tr_solver="lsmr",
        x_scale="jac",
        max_nfev=max_evaluations,
        xtol=1e-15,
        ftol=1e-15,
        gtol=1e-15,
    )
    _, x = unpack(fit.x)
    r = missing.mean()
    identifiable = r * n * d_dim + n * length <= (1 - r) * d_dim * (length + 1)
    note = f"{r:.0%} of G_p masked; {fit.nfev} evaluations, final cost {fit.cost:.2e}; equation count " + (
        "allows a unique solution" if identifiable else "exceeded: a fit need not be the image"
    )
    return Reconstruction(patches_to_image(x, obs), note)


def collusion_key(obs: Observation) -> tuple[np.ndarray, np.ndarray, str] | None:
    """The encryption key estimated from known images (collusion): (E_aᵀ estimate [L, L], the encrypted patch row
    of each plaintext patch [N], a note), or None without known images.

    Each known single-image update gives Y_i = Π X_i E_aᵀ through the embedding route. fedvit's E_a is orthogonal,
    so Y_i Y_iᵀ = Π X_i X_iᵀ Πᵀ: the Gram matrices of the patches survive encryption, and matching their rows
    (sorted, over all known images; Hungarian assignment) recovers Π. Then E_aᵀ = (X_stack)⁺ Πᵀ Y_stack, exact
    once the known images hold L independent patches (⌈L/N⌉ images: 12 for the tiny model, 4 for ViT-S/16).
    """
    from scipy.optimize import linear_sum_assignment

    known = obs.known_images or []
    if not known:
        return None
    xs, ys = [], []
    for image, update in known:
        xs.append(image_to_patches(image, obs))
        ys.append(embedding_route_patches(dataclasses.replace(obs, update=update, known_images=None)))
    sig_x = np.concatenate([np.sort(x @ x.T, axis=1) for x in xs], axis=1)
    sig_y = np.concatenate([np.sort(y @ y.T, axis=1) for y in ys], axis=1)
    cost = ((sig_y[:, None, :] - sig_x[None, :, :]) ** 2).sum(-1)
    _, perm = linear_sum_assignment(cost)  # encrypted row s holds plaintext patch perm[s]
    inverse = np.argsort(perm)
    x_stack = np.concatenate(xs)
    y_stack = np.concatenate([y[inverse] for y in ys])
    rank = np.linalg.matrix_rank(x_stack)
    note = f"{len(known)} known images, {x_stack.shape[0]} patches, rank {rank} of L = {x_stack.shape[1]}"
    return lstsq(x_stack, y_stack), inverse, note


def decrypt_observation(obs: Observation, e_a_t: np.ndarray, inverse: np.ndarray) -> Observation:
    """The observation in plaintext under an estimated key: W_E = Ŵ_E (E_aᵀ)⁻¹ and the position rows put back
    (update and received model alike; both are encrypted the same way), with encryption off in its defence."""
    e_a_t_inv = np.linalg.pinv(e_a_t, rcond=EPS_RANK)
    rows = np.concatenate([[0], 1 + inverse])  # the class row stays first

    def plain(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = dict(arrays)
        w = out[PATCH_EMBED_WEIGHT]
        flat = w.reshape(w.shape[0], -1).astype(np.float64)
        out[PATCH_EMBED_WEIGHT] = (flat @ e_a_t_inv).astype(w.dtype).reshape(w.shape)
        out[POS_EMBED] = np.ascontiguousarray(out[POS_EMBED][:, rows])
        return out

    masks = None
    if obs.masks is not None:  # E_a forbids masking the patch embedding (all kept); the position rows move back
        masks = dict(obs.masks) | {POS_EMBED: np.ascontiguousarray(obs.masks[POS_EMBED][:, rows])}
    return dataclasses.replace(
        obs, update=plain(obs.update), received=plain(obs.received), masks=masks,
        defence=dataclasses.replace(obs.defence, encryption="off"),
        known_images=None, known_plaintext=None, known_ciphertext=None,
    )  # fmt: skip


def known_images_route(obs: Observation) -> Reconstruction:
    """Break embedding encryption with known images (collusion: the attacker knows some clients' images and sees
    their encrypted single-image updates under the same key): the key from :func:`collusion_key`, then the
    embedding route on the decrypted update."""
    key = collusion_key(obs)
    if key is None:
        return Reconstruction(None, "no known images")
    e_a_t, inverse, note = key
    y = embedding_route_patches(obs)
    x = (y @ np.linalg.pinv(e_a_t, rcond=EPS_RANK))[inverse]
    return Reconstruction(patches_to_image(x, obs), note)
