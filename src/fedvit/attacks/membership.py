"""Membership inference on a captured update: was this image in the client's training data?

A family of scores per candidate image (:class:`Score`; :mod:`fedvit.audit.registry` runs each as an entry): the
loss of the sent weights −ℓ(w_sent, x), with one threshold for all classes (the plain loss attack) and calibrated per
class (:func:`sent_loss_score`); the loss drop ℓ(w_received, x) − ℓ(w_sent, x) (:func:`loss_drop_score`); and, for a
multi-step update whose class counts were estimated (the label estimate's simulation), gradient alignment
(:func:`alignment_scores`): the update, minus the mean of K shadow updates (:func:`reference_updates`: the client's
local training simulated from the received weights on images that are none of the candidates: Carlini et al.'s
offline reference models, adapted to one update), is a sum of the members' gradients, each η/B per visit, and of what
the shadows did not reproduce; the span of the shadow images' gradients is projected out of it, and each candidate's
gradient, taken at points along the simulated local training, is dotted with what remains (the inner-product signal
of gradient-level membership attacks: Nasr et al., "Comprehensive Privacy Analysis of Deep Learning", S&P 2019;
FedMIA, arXiv 2402.06289). A gradient reply is turned into the step it implies (w_received − η g, η the recipe's lr,
else a step of 1% of the weights' norm). Candidates are the client's own images (members) and images it never held
(non-members). A calibrated score is its rank among the known non-members of its class (Carlini et al. calibrate per
example; with one update per client the class is the finest reference an eavesdropper has, and it removes the class
skew a FedAvg update always carries). Judging the scores against the members and non-members, their nulls and the
power twin are the audit's (:mod:`fedvit.audit.membership_stats`, :mod:`fedvit.audit.membership_runs`): this module
scores each side's candidates and judges none of them."""

from __future__ import annotations

import dataclasses
import hashlib
import math
import time
from collections.abc import Iterator

import numpy as np
import torch
import torch.nn.functional as F
from torch.func import functional_call, grad, vmap

from fedvit.attacks.holdings import Auxiliary, Candidates
from fedvit.attacks.scores import Score, evenly
from fedvit.attacks.simulation import Simulation, simulate
from fedvit.core.budget import MEMBERSHIP_REFERENCES
from fedvit.core.model import classify, normalize
from fedvit.observed.augmentation import VIEWS, Augmentation, augmented, banked
from fedvit.observed.observation import (
    Observation,
    explicit_attention,
    model_with,
    received_model,
    recipe,
    trained_names,
)

BATCH = 256  # candidates per forward pass
REFERENCES = MEMBERSHIP_REFERENCES  # shadow updates per multi-step update (fewer where REFERENCE_SECONDS runs out)
REFERENCE_SECONDS = 60.0
ALIGNMENT_POINTS = 3  # weights along the local training where the candidates' gradients are taken
PROJECTION_POOL = 2000  # pool images whose gradients span what the residual is cleared of
GRADIENT_BYTES = 2**31  # per-image gradients held at once (float32): bounds the pool and the chunks on large models
GRAM_BLOCK = 500  # rows per block of the pool gradients' Gram matrix (only the blocks on and above its diagonal)
RANK_ONE_TOLERANCE = 1e-4  # relative error a linear layer's per-image weight gradient may have against δ aᵀ


@torch.no_grad()
def losses(
    model: torch.nn.Module, images: np.ndarray, labels: np.ndarray, augmentation: Augmentation | None = None
) -> np.ndarray:
    """Per-image cross-entropy, in batches of :data:`BATCH`; under an ``augmentation``, the mean over
    :data:`~fedvit.observed.augmentation.VIEWS` random views (the same views for every model: view k's randomness
    is seeded by k), or over every view of a bank (a frozen backbone's precomputed views)."""
    if augmentation is None:
        views: list = [None]
    elif augmentation.bank:
        views = list(range(1, augmentation.bank + 1))
    else:
        views = [torch.Generator().manual_seed(k) for k in range(VIEWS)]
    total = np.zeros(len(images))
    for view in views:
        out = []
        for first in range(0, len(images), BATCH):
            x = torch.as_tensor(images[first : first + BATCH], dtype=torch.float32)
            if isinstance(view, int):
                x = banked(x, torch.full((len(x),), view))
            elif view is not None:
                x = augmented(x, augmentation, view)
            y = torch.as_tensor(labels[first : first + BATCH], dtype=torch.int64)
            out.append(F.cross_entropy(classify(model, x), y, reduction="none").double().numpy())
        total += np.concatenate(out) if out else 0.0
    return total / len(views)


def sent_weights(obs: Observation) -> dict[str, np.ndarray]:
    """The weights the reply implies: the sent weights, or the received ones moved one step against a gradient."""
    client = recipe(obs)
    if not client.sends_gradient:
        return obs.update
    norm = np.sqrt(sum(float((obs.received[n] ** 2).sum()) for n in obs.update))
    grad_norm = np.sqrt(sum(float((g**2).sum()) for g in obs.update.values()))
    step = client.lr if client.lr > 0 else 0.01 * norm / max(grad_norm, 1e-12)
    return {n: obs.received[n] - step * g for n, g in obs.update.items()}


def per_sample_gradients(
    model: torch.nn.Module, images: np.ndarray, labels: np.ndarray, names: list[str] | None = None
) -> Iterator[torch.Tensor]:
    """∇_w ℓ(w, x_i) of each image, flattened over ``model``'s parameters (``names`` only, in the model's order,
    when given: a partial update's), in chunks [b, P] of up to :data:`BATCH` (a quarter of :data:`GRADIENT_BYTES`
    each; ``torch.func``: one vectorised backward pass per chunk; eval mode; ``model`` is switched to timm's
    explicit attention)."""
    for _, parts in gradient_parts(model, images, labels, names):
        yield torch.cat(parts, 1)


def gradient_matrix(
    model: torch.nn.Module, images: np.ndarray, labels: np.ndarray, names: list[str] | None = None
) -> torch.Tensor:
    """:func:`per_sample_gradients` of all ``images`` as one [n, P] tensor, each chunk written into its rows (no
    concatenated copies: the projection pool's is up to 1 GB)."""
    rows = torch.empty(len(images), parameter_count(model, names))
    for first, parts in gradient_parts(model, images, labels, names):
        torch.cat(parts, 1, out=rows[first : first + len(parts[0])])
    return rows


def differentiated(
    model: torch.nn.Module, names: list[str] | None
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:  # fmt: skip
    """``model``'s parameters split into those a per-image derivative is taken in (``names``, in the model's order;
    None: all) and the rest, constants of it; the model switched to timm's explicit attention (the fused kernel has
    no batching rule: vmap would loop over images)."""
    explicit_attention(model)
    chosen = None if names is None else set(names)
    params = {n: p.detach() for n, p in model.named_parameters() if chosen is None or n in chosen}
    frozen = {n: p.detach() for n, p in model.named_parameters() if n not in params}
    return params, frozen


def gradient_parts(
    model: torch.nn.Module, images: np.ndarray, labels: np.ndarray, names: list[str] | None
) -> Iterator[tuple[int, list[torch.Tensor]]]:
    """(first image, [b, size] per parameter) of each chunk of :func:`per_sample_gradients`."""
    params, frozen = differentiated(model, names)

    def loss(weights: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = functional_call(model, frozen | weights, (x[None],))
        return F.cross_entropy(getattr(out, "logits", out), y[None])

    per_image = vmap(grad(loss), in_dims=(None, 0, 0))
    chunk = max(1, min(BATCH, GRADIENT_BYTES // 4 // (4 * parameter_count(model, names))))
    for first in range(0, len(images), chunk):
        x = normalize(model, torch.as_tensor(images[first : first + chunk], dtype=torch.float32))
        y = torch.as_tensor(labels[first : first + chunk], dtype=torch.int64)
        grads = per_image(params, x, y)
        yield first, [grads[n].flatten(1) for n in params]


def loss_slopes(
    model: torch.nn.Module, images: np.ndarray, labels: np.ndarray, names: list[str] | None, direction: torch.Tensor
) -> np.ndarray:  # fmt: skip
    """⟨∇_w ℓ(w, x_i), d⟩ of each image: the derivative of its loss along ``direction`` d (flattened over ``names``
    in the model's order, as :func:`per_sample_gradients` lays them out), by forward mode (``torch.func.jvp``: one
    pass per chunk of :data:`BATCH`, no per-image gradient held); eval mode, timm's explicit attention."""
    params, frozen = differentiated(model, names)
    if (size := sum(p.numel() for p in params.values())) != len(direction):
        raise ValueError(f"the direction has {len(direction)} entries, the parameters {size}")
    tangents = {name: direction[span].view_as(params[name]).to(params[name].dtype)
                for name, span in column_spans(params).items()}  # fmt: skip
    found = []
    for first in range(0, len(images), BATCH):
        x = normalize(model, torch.as_tensor(images[first : first + BATCH], dtype=torch.float32))
        y = torch.as_tensor(labels[first : first + BATCH], dtype=torch.int64)

        def loss(weights: dict[str, torch.Tensor], x: torch.Tensor = x, y: torch.Tensor = y) -> torch.Tensor:
            out = functional_call(model, frozen | weights, (x,))
            return F.cross_entropy(getattr(out, "logits", out), y, reduction="none")

        found.append(torch.func.jvp(loss, (params,), (tangents,))[1].double().numpy())
    return np.concatenate(found) if found else np.zeros(0)


def parameter_count(model: torch.nn.Module, names: list[str] | None = None) -> int:
    """Entries of ``model``'s parameters (of ``names`` only, when given)."""
    return sum(p.numel() for n, p in model.named_parameters() if names is None or n in names)


def projection_pool(model: torch.nn.Module, names: list[str] | None = None) -> int:
    """How many pool images' gradients (over ``names``, when given) span the projection: :data:`PROJECTION_POOL`,
    fewer where their float32 gradients would exceed half of :data:`GRADIENT_BYTES` (large models: reported with
    the result)."""
    return max(1, min(PROJECTION_POOL, GRADIENT_BYTES // 2 // (4 * parameter_count(model, names))))


def residual(obs: Observation, shadows: list[Simulation]) -> torch.Tensor:
    """r = mean_k w_k − w_sent over the model's parameters, flattened in their order: the shadows' common drift (e.g.
    the client's class prior) cancels; each member's gradients remain, η/B per visit."""
    sent = sent_weights(obs)
    names = trained_names(obs)
    mean = {n: np.mean([s.weights[n] for s in shadows], axis=0) for n in names}
    return torch.cat([torch.as_tensor(mean[n] - sent[n], dtype=torch.float64).flatten() for n in names])


# key -> (G, factorised G Gᵀ) of the pool gradients at the received weights. Every update's first alignment point is
# the weights the server sent, the same for every client of a round, and so is the pool: its per-image gradients and
# Gram matrix (O(pool² × parameters), the alignment score's costliest step) are computed and factorised once per
# round, not once per update. G (factored: PoolGradients) is held until the next round or forget_received_projection.
_received_projection: dict[str, tuple[PoolGradients, GramFactor]] = {}
SOLVE_TOLERANCE = 1e-8  # relative residual of the normal equations a Cholesky solve must meet, else the pseudo-inverse
PINV_RTOL = 1e-10


@dataclasses.dataclass
class GramFactor:
    """G Gᵀ factorised once: its Cholesky factor, and where a solve with it misses the normal equations (a singular
    or ill-conditioned Gram matrix), its pseudo-inverse, computed then and kept. Either gives the projection onto
    G's row space: every solution a of G Gᵀ a = G r gives the same Gᵀ a."""

    gram: torch.Tensor  # float64
    cholesky: torch.Tensor | None
    inverse: torch.Tensor | None = None

    def solve(self, b: torch.Tensor) -> tuple[torch.Tensor, str]:
        """a with G Gᵀ a ≈ b (float64), and which factor gave it."""
        if self.cholesky is not None:
            a = torch.cholesky_solve(b[:, None], self.cholesky)[:, 0]
            norm = torch.linalg.vector_norm
            missed = float(norm(self.gram @ a - b)) / max(float(norm(b)), 1e-300)
            if missed <= SOLVE_TOLERANCE:
                return a, "cholesky"
        if self.inverse is None:
            self.inverse = torch.linalg.pinv(self.gram, hermitian=True, rtol=PINV_RTOL)
        return self.inverse @ b, "pseudo-inverse"


def factorised(gram: torch.Tensor) -> GramFactor:
    """:class:`GramFactor` of a Gram matrix: Cholesky where it exists (a positive definite matrix), the
    pseudo-inverse on demand."""
    gram = gram.double()
    factor, info = torch.linalg.cholesky_ex(gram)
    return GramFactor(gram, factor if int(info) == 0 else None)


def projection_key(model: torch.nn.Module, chosen: tuple[np.ndarray, np.ndarray], names: list[str]) -> str:
    """A digest of everything the pool gradients G depend on: the model's class and state, the pool images and
    labels, and the parameters differentiated."""
    digest = hashlib.blake2b(digest_size=20)
    digest.update(f"{type(model).__module__}.{type(model).__qualname__}|{names}".encode())
    for name, tensor in model.state_dict().items():
        digest.update(f"{name}{tuple(tensor.shape)}{tensor.dtype}".encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    for array in chosen:
        digest.update(f"{array.shape}{array.dtype}".encode())
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()


def gram_matrix(g: torch.Tensor, block: int = GRAM_BLOCK) -> torch.Tensor:
    """G Gᵀ of the rows of ``g``, from the blocks on and above the diagonal (each mirrored below it): about half the
    multiplications of ``g @ g.T``. The rows are split into nearly equal blocks of at most ``block``, never a small
    remainder, so that each block product takes the matrix-multiplication path the whole product takes: bit-equal
    to ``g @ g.T`` on PyTorch's CPU builds (tested)."""
    n = len(g)
    edges = np.linspace(0, n, max(1, math.ceil(n / block)) + 1).round().astype(int)
    spans = list(zip(edges[:-1], edges[1:], strict=True))
    gram = torch.empty(n, n, dtype=g.dtype)
    for k, (top, bottom) in enumerate(spans):
        for left, right in spans[k:]:
            product = g[top:bottom] @ g[left:right].T
            gram[top:bottom, left:right] = product
            if left != top:
                gram[left:right, top:bottom] = product.T
    return gram


def column_spans(params: dict[str, torch.Tensor]) -> dict[str, slice]:
    """Each parameter's columns in the flattened layout of :func:`gradient_matrix` (the parameters in order)."""
    spans, offset = {}, 0
    for name, param in params.items():
        spans[name] = slice(offset, offset + param.numel())
        offset += param.numel()
    return spans


def linear_layers(
    model: torch.nn.Module, names: list[str] | None
) -> list[tuple[tuple[str, str], torch.nn.Linear, slice, slice]]:  # fmt: skip
    """Per ``nn.Linear`` whose weight and bias are both differentiated: the names of its weight and bias, the
    module, and the columns of its weight and of its bias in :func:`gradient_matrix`'s layout."""
    spans = column_spans(differentiated(model, names)[0])
    found = []
    for prefix, module in model.named_modules():
        weight, bias = (f"{prefix}.{p}" if prefix else p for p in ("weight", "bias"))
        if isinstance(module, torch.nn.Linear) and weight in spans and bias in spans:
            found.append(((weight, bias), module, spans[weight], spans[bias]))
    return found


@dataclasses.dataclass(frozen=True)
class LinearFactors:
    """A linear layer's per-image gradients δ_i a_iᵀ (weight) and δ_i (bias), held as their factors: the layer's
    output gradient δ [n, out] and input a [n, in] per image."""

    weight: slice
    bias: slice
    delta: torch.Tensor
    inputs: torch.Tensor


@dataclasses.dataclass(frozen=True)
class PoolGradients:
    """G [n, P], the pool images' per-image gradients in :func:`gradient_matrix`'s layout, held factored: a linear
    layer applied once per image has the per-image gradient δ aᵀ (weight) and δ (bias), so its columns are kept as
    δ and a (:class:`LinearFactors`; n (in + out) numbers instead of n · in · out); every other column is explicit
    (``dense``, at the columns ``rest``). G v, Gᵀ c and G Gᵀ are computed from the factors: a linear layer's block of
    G Gᵀ is (Δ Δᵀ) ⊙ (A Aᵀ + 1) (the identity per-example gradient-norm methods use, Goodfellow, "Efficient
    Per-Example Gradient Computations", arXiv 1510.01799). Equal to the explicit G's to float32 rounding (tested)."""

    size: int
    linear: tuple[LinearFactors, ...]
    dense: torch.Tensor
    rest: torch.Tensor  # column indices of ``dense``

    def times(self, v: torch.Tensor) -> torch.Tensor:
        """G v [n] (float32)."""
        out = self.dense @ v[self.rest]
        for f in self.linear:
            block = v[f.weight].view(f.delta.shape[1], f.inputs.shape[1])
            out = out + ((f.delta @ block) * f.inputs).sum(1) + f.delta @ v[f.bias]
        return out

    def transposed_times(self, c: torch.Tensor) -> torch.Tensor:
        """Gᵀ c [P] (float32)."""
        full = torch.zeros(self.size, dtype=c.dtype)
        full[self.rest] = self.dense.T @ c
        for f in self.linear:
            full[f.weight] = (f.delta.T @ (c[:, None] * f.inputs)).flatten()
            full[f.bias] = f.delta.T @ c
        return full

    def gram(self) -> torch.Tensor:
        """G Gᵀ [n, n]: the linear layers' blocks from their factors, the rest by :func:`gram_matrix`."""
        gram = None
        for f in self.linear:
            block = (f.delta @ f.delta.T) * (f.inputs @ f.inputs.T + 1)
            gram = block if gram is None else gram + block
        if gram is None:
            return gram_matrix(self.dense)
        return gram + gram_matrix(self.dense) if self.dense.shape[1] else gram


def pool_gradients(
    model: torch.nn.Module, images: np.ndarray, labels: np.ndarray, names: list[str] | None = None
) -> PoolGradients:  # fmt: skip
    """:class:`PoolGradients` of ``images`` over ``names`` (None: every parameter). Each linear layer's δ and a are
    read in one batched backward pass per chunk (cross-entropy summed over the images, eval mode: each image's loss
    depends on its own output only); a layer is factored only where it ran once per image on a [b, in] input and,
    on the first images, the factors give what the per-image derivative (:func:`per_sample_gradients`) gives, to
    :data:`RANK_ONE_TOLERANCE`. Every other parameter's columns are :func:`gradient_matrix`'s."""
    params, _ = differentiated(model, names)
    size = sum(p.numel() for p in params.values())
    layers = linear_layers(model, names)
    found = layer_factors(model, images, labels, [module for _, module, _, _ in layers])
    factored = []
    for (pair, _, weight, bias), factors in zip(layers, found, strict=True):
        if factors is not None and factors_match(model, images, labels, pair, *factors):
            factored.append(LinearFactors(weight, bias, *factors))
    kept = torch.ones(size, dtype=torch.bool)
    for f in factored:
        kept[f.weight] = kept[f.bias] = False
    spans = column_spans(params)
    rest_names = [n for n in params if kept[spans[n]].all()]
    dense = gradient_matrix(model, images, labels, rest_names) if rest_names else torch.zeros(len(images), 0)
    return PoolGradients(size, tuple(factored), dense, torch.nonzero(kept).flatten())


def layer_factors(
    model: torch.nn.Module, images: np.ndarray, labels: np.ndarray, modules: list[torch.nn.Linear]
) -> list[tuple[torch.Tensor, torch.Tensor] | None]:  # fmt: skip
    """Per linear layer, its output gradient δ [n, out] and input a [n, in] per image, or None where it did not run
    exactly once per chunk on a [b, in] input (it runs on tokens or positions, or twice)."""
    if not modules:
        return []
    deltas: list[list[torch.Tensor]] = [[] for _ in modules]
    inputs: list[list[torch.Tensor]] = [[] for _ in modules]
    usable = [True] * len(modules)
    seen: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in modules]  # per layer, (input, output) per call
    hooks = [m.register_forward_hook(lambda m, i, o, k=k: seen[k].append((i[0], o))) for k, m in enumerate(modules)]
    try:
        for first in range(0, len(images), BATCH):
            for calls in seen:
                calls.clear()
            with torch.enable_grad():
                x = normalize(model, torch.as_tensor(images[first : first + BATCH], dtype=torch.float32))
                y = torch.as_tensor(labels[first : first + BATCH], dtype=torch.int64)
                out = model(x.requires_grad_(True))
                loss = F.cross_entropy(getattr(out, "logits", out), y, reduction="sum")
                for k, calls in enumerate(seen):
                    usable[k] = usable[k] and len(calls) == 1 and calls[0][0].dim() == 2 and len(calls[0][0]) == len(x)
                wanted = [k for k in range(len(modules)) if usable[k]]
                outputs = [seen[k][0][1] for k in wanted]
                grads = torch.autograd.grad(loss, outputs, allow_unused=True) if outputs else ()
            for k, g in zip(wanted, grads, strict=True):
                if g is None:
                    usable[k] = False
                    continue
                deltas[k].append(g.detach())
                inputs[k].append(seen[k][0][0].detach())
    finally:
        for hook in hooks:
            hook.remove()
    return [(torch.cat(deltas[k]), torch.cat(inputs[k])) if usable[k] else None for k in range(len(modules))]


def factors_match(model: torch.nn.Module, images: np.ndarray, labels: np.ndarray, pair: tuple[str, str],
                  delta: torch.Tensor, inputs: torch.Tensor, check: int = 4) -> bool:  # fmt: skip
    """Whether δ aᵀ and δ give the per-image gradients of the layer's weight and bias (``pair``, their names) on the
    first ``check`` images, to :data:`RANK_ONE_TOLERANCE` of their norm (a model whose batched pass mixes its images
    would not)."""
    weight, bias = pair
    exact = gradient_matrix(model, images[:check], labels[:check], [weight, bias])
    names = [n for n, _ in model.named_parameters() if n in (weight, bias)]  # the model's order
    parts = {weight: (delta[:check, :, None] * inputs[:check, None, :]).flatten(1), bias: delta[:check]}
    factored = torch.cat([parts[n] for n in names], 1)
    miss = torch.linalg.vector_norm(factored - exact, dim=1)
    return bool((miss <= RANK_ONE_TOLERANCE * torch.linalg.vector_norm(exact, dim=1) + 1e-30).all())


def residual_direction(
    obs: Observation, r: torch.Tensor, point: dict[str, np.ndarray], pool: Auxiliary, received: bool = False
) -> tuple[torch.nn.Module, torch.Tensor]:  # fmt: skip
    """The model at ``point`` and what the client's update holds that neither shadows nor pool explain: the
    :func:`residual` ``r`` with the span of the pool images' gradients at ``point`` projected out (r − Gᵀ(GGᵀ)⁺G r:
    whatever any non-member's gradient could have put there, shadow noise included). ``received``: ``point`` is
    the received weights (the last such projection is remembered: other clients of the round share it). G is held
    factored (:func:`pool_gradients`)."""
    model = model_with(obs, point).float().eval()
    names = trained_names(obs)
    chosen = evenly(pool.images, pool.labels, projection_pool(model, names))
    key = projection_key(model, chosen, names) if received else None
    if key in _received_projection:  # a None key is never stored
        g, factor = _received_projection[key]
    else:
        if key is not None:
            _received_projection.clear()  # the last round's G goes before this one's is computed
        g = pool_gradients(model, *chosen, names)
        factor = factorised(g.gram())
        if key is not None:
            _received_projection[key] = (g, factor)
    # G's products in float32, the accuracy G Gᵀ has (its float32 product), the solve in float64
    a, _ = factor.solve(g.times(r.float()).double())
    return model, (r - g.transposed_times(a.float()).double()).float()


def forget_received_projection() -> None:
    """Release the received weights' pool gradients and factor (:func:`residual_direction` keeps the last round's)."""
    _received_projection.clear()


def alignment_points(obs: Observation, shadows: list[Simulation]) -> list[dict[str, np.ndarray]]:
    """Weights along the client's local training, evenly spaced over its steps: the received weights, then the
    shadows' mean parameters at later snapshots (a member's gradient enters the update where the client visited it,
    not at the received weights)."""
    points = [{n: np.asarray(v) for n, v in obs.received.items()}]
    for k in range(1, len(shadows[0].snapshots)):
        points.append({n: np.mean([s.snapshots[k][n] for s in shadows], axis=0) for n in shadows[0].snapshots[k]})
    return points


def alignment_scores(
    obs: Observation, shadows: list[Simulation], pool: Auxiliary, sides: list[tuple[np.ndarray, np.ndarray]]
) -> list[np.ndarray]:  # fmt: skip
    """Per image of each side, Σ_points ⟨∇ℓ(w_point, x), r_point⟩ / σ_point: how far its own gradient points along
    the part of the update that nothing but the client's images explains (:func:`residual_direction`, one point per
    shadow snapshot: :func:`alignment_points`); σ is the spread of the last side's (the non-members') alignments at
    that point, so each point weighs alike."""
    totals = [np.zeros(len(images)) for images, _ in sides]
    r = residual(obs, shadows)
    names = trained_names(obs)
    for k, point in enumerate(alignment_points(obs, shadows)):
        model, direction = residual_direction(obs, r, point, pool, received=k == 0)
        found = [loss_slopes(model, *side, names, direction) for side in sides]
        spread = max(float(found[-1].std()), 1e-30)
        totals = [t + f / spread for t, f in zip(totals, found, strict=True)]
    return totals


def split_for_references(candidates: Candidates) -> tuple[Candidates, Auxiliary]:
    """Every other non-member moves to the shadow updates' images: none of the scored non-members trains a shadow
    (one that did would score lower on the real split only, which the within-class null cannot see)."""
    images, labels = candidates.non_members
    pool = Auxiliary(images[0::2], labels[0::2], f"half of {candidates.source}")
    kept = dataclasses.replace(candidates, non_members=(images[1::2], labels[1::2]),
                               source=f"the other half of {candidates.source}")  # fmt: skip
    return kept, pool


def reference_updates(
    obs: Observation, pool: Auxiliary, counts: np.ndarray, momentum: float, seed: int,
    count: int = REFERENCES, seconds: float = REFERENCE_SECONDS,
) -> list[Simulation]:  # fmt: skip
    """Up to ``count`` shadow updates (the offline reference models of Carlini et al., adapted to one update): the
    client's local training from the received weights (its recipe, ``momentum``) on ``pool`` images drawn to the
    class ``counts`` the label estimate found, each with its own draw and order; stops after ``seconds``."""
    found, started = [], time.perf_counter()
    for k in range(count):
        found.append(simulate(obs, pool, counts, momentum, seed + 1 + k, keep_weights=True, snapshots=ALIGNMENT_POINTS,
                              private=True))  # fmt: skip
        if time.perf_counter() - started > seconds:
            break
    return found


# ---- the scores: each a function of the update and the candidates (fedvit.audit.registry runs them)

SENT_LOSS, SENT_LOSS_PER_CLASS, LOSS_DROP, ALIGNMENT = (
    "loss of the sent weights", "loss of the sent weights, per class", "loss drop", "shadow alignment"
)  # fmt: skip


def sides(candidates: Candidates) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """The members and non-members that are scored (at most :data:`MAX_CANDIDATES` each: :func:`evenly`)."""
    return evenly(*candidates.members), evenly(*candidates.non_members)


def candidate_losses(obs: Observation, candidates: Candidates) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per-image cross-entropy of the scored members and non-members under the received and the sent weights
    (:func:`sent_weights`; eval mode: BatchNorm on the received running statistics); under the client's declared
    augmentation, each image's mean over random views."""
    received = received_model(obs).float().eval()
    sent = model_with(obs, sent_weights(obs)).float().eval()
    augmentation = recipe(obs).augment
    return {name: tuple(losses(model, *side, augmentation) for side in sides(candidates))
            for name, model in (("received", received), ("sent", sent))}  # fmt: skip


def sent_loss_score(found: dict[str, tuple[np.ndarray, np.ndarray]], per_class: bool) -> Score:
    """−ℓ(w_sent, x), as :func:`confidence_logit`: the loss-threshold attack (Yeom et al., "Privacy Risk in Machine
    Learning", CSF 2018, arXiv 1709.01604) on the model an eavesdropper holds; one threshold for all classes, or per
    class."""
    members, non_members = found["sent"]
    name = SENT_LOSS_PER_CLASS if per_class else SENT_LOSS
    return Score(name, "the sent model's loss on each image", confidence_logit(members), confidence_logit(non_members),
                 per_class)  # fmt: skip


def confidence_logit(loss: np.ndarray) -> np.ndarray:
    """log(p / (1 − p)) of the true class's probability p = e^−ℓ: decreasing in the loss, so every rank and ROC figure
    is the loss's; LiRA scales confidences so because the result is close to Gaussian per example and class, which
    the parametric fit (:meth:`Score.fitted`) assumes (Carlini et al., arXiv 2112.03570)."""
    loss = np.maximum(loss, 1e-12)
    return -loss - np.log(-np.expm1(-loss))


def loss_drop_score(found: dict[str, tuple[np.ndarray, np.ndarray]]) -> Score:
    """ℓ(w_received, x) − ℓ(w_sent, x): how much the update lowered each image's loss."""
    (received_in, received_out), (sent_in, sent_out) = found["received"], found["sent"]
    return Score(LOSS_DROP, "the loss drop from the received model", received_in - sent_in, received_out - sent_out)


def alignment_score(obs: Observation, candidates: Candidates, shadows: list[Simulation], pool: Auxiliary) -> Score:
    """:func:`alignment_scores` of the scored candidates against ``shadows`` trained on ``pool``."""
    inside, outside = alignment_scores(obs, shadows, pool, list(sides(candidates)))
    spanned = min(len(pool.images), projection_pool(received_model(obs), trained_names(obs)))
    reference = (f"the update beyond {len(shadows)} shadow updates, against each image's gradient at "
                 f"{max(1, len(shadows[0].snapshots))} point(s) of the local training ({spanned} shadow "
                 "images' gradients projected out)")  # fmt: skip
    return Score(ALIGNMENT, reference, inside, outside)


LOSS_SCORES = (SENT_LOSS, SENT_LOSS_PER_CLASS, LOSS_DROP)  # the scores the power simulation runs (no shadows)


def loss_scores(found: dict[str, tuple[np.ndarray, np.ndarray]]) -> list[Score]:
    """The loss-based scores (:data:`LOSS_SCORES`) from the candidates' losses."""
    return [sent_loss_score(found, False), sent_loss_score(found, True), loss_drop_score(found)]
