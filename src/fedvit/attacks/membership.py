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
skew a FedAvg update always carries). :func:`judge` reports the strongest score's ROC AUC and TPR at 0.1% and 1% FPR
as Carlini et al. ask ("Membership Inference Attacks From First Principles", S&P 2022, arXiv 2112.03570) — only at
FPRs the calibrated scores resolve (:func:`fpr_resolution`; below it, how many non-members per class the target
needs), with Clopper–Pearson intervals on the TPR and on the FPR actually reached — each beside its null: the same
figures with the member/non-member labels shuffled within each class (a control that holds no information about
membership beyond the two sides' class composition), taken over the whole family so that choosing the strongest
score does not inflate the evidence (:func:`null_figures`)."""

from __future__ import annotations

import dataclasses
import hashlib
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from scipy.special import ndtri
from torch.func import functional_call, grad, vmap

from fedvit.attacks.augmentation import VIEWS, Augmentation, augmented
from fedvit.attacks.label_distribution import Auxiliary, Simulation, simulate
from fedvit.attacks.observation import Observation, model_with, received_model, recipe, trained_names
from fedvit.attacks.reidentification import evenly_spaced
from fedvit.core.model import classify, normalize

FPRS = (0.001, 0.01)
CONFIDENCE = 0.95  # Clopper–Pearson intervals on the TPR and the FPR reached
NULL_DRAWS = 1000  # within-class label shuffles behind the null
NULL_QUANTILE = 0.999  # a finding must beat this quantile of the null (per figure and update)
MAX_CANDIDATES = 5000  # per side; more are subsampled (evenly)
BATCH = 256  # candidates per forward pass
REFERENCES = 8  # shadow updates per multi-step update (fewer where REFERENCE_SECONDS runs out)
REFERENCE_SECONDS = 60.0
ALIGNMENT_POINTS = 3  # weights along the local training where the candidates' gradients are taken
PROJECTION_POOL = 2000  # pool images whose gradients span what the residual is cleared of
FIT_MINIMUM = 20  # non-members of a class a Gaussian fit of their scores needs (LiRA's offline test)
PARAMETRIC = "tpr@0.001-parametric"  # TPR at 0.1% FPR of the per-class Gaussian fit
GRADIENT_BYTES = 2**31  # per-image gradients held at once (float32): bounds the pool and the chunks on large models
GRAM_BLOCK = 500  # rows per block of the pool gradients' Gram matrix (only the blocks on and above its diagonal)
EPSILON_NULL_DRAWS = 200  # within-class shuffles behind the empirical ε's null (each one a full bound: ~12 ms)


@dataclasses.dataclass(frozen=True)
class Candidates:
    """Member and non-member images [n, C, H, W] in [0, 1] with their labels, and where the non-members came from;
    ``canaries``: planted images, each in the client's training with probability ½ (members: those included)."""

    members: tuple[np.ndarray, np.ndarray]
    non_members: tuple[np.ndarray, np.ndarray]
    source: str
    canaries: bool = False


def evenly(images: np.ndarray, labels: np.ndarray, most: int = MAX_CANDIDATES) -> tuple[np.ndarray, np.ndarray]:
    """At most ``most`` of the images (evenly spaced) with their labels."""
    if len(images) <= most:
        return images, labels
    keep = evenly_spaced(len(images), most)
    return images[keep], labels[keep]


@torch.no_grad()
def losses(
    model: torch.nn.Module, images: np.ndarray, labels: np.ndarray, augmentation: Augmentation | None = None
) -> np.ndarray:
    """Per-image cross-entropy, in batches of :data:`BATCH`; under an ``augmentation``, the mean over
    :data:`~fedvit.attacks.augmentation.VIEWS` random views (the same views for every model: view k's randomness
    is seeded by k)."""
    views = [None] if augmentation is None else [torch.Generator().manual_seed(k) for k in range(VIEWS)]
    total = np.zeros(len(images))
    for generator in views:
        out = []
        for first in range(0, len(images), BATCH):
            x = torch.as_tensor(images[first : first + BATCH], dtype=torch.float32)
            x = x if generator is None else augmented(x, augmentation, generator)
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
    for module in model.modules():  # timm's fused attention has no batching rule (vmap would loop over images)
        if hasattr(module, "fused_attn"):
            module.fused_attn = False
    chosen = None if names is None else set(names)
    params = {n: p.detach() for n, p in model.named_parameters() if chosen is None or n in chosen}
    frozen = {n: p.detach() for n, p in model.named_parameters() if n not in params}  # constants of the gradient

    def loss(weights: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = functional_call(model, frozen | weights, (x[None],))
        return F.cross_entropy(getattr(out, "logits", out), y[None])

    per_image = vmap(grad(loss), in_dims=(None, 0, 0))
    chunk = max(1, min(BATCH, GRADIENT_BYTES // 4 // (4 * parameter_count(model, names))))
    for first in range(0, len(images), chunk):
        x = normalize(model, torch.as_tensor(images[first : first + chunk], dtype=torch.float32))
        y = torch.as_tensor(labels[first : first + chunk], dtype=torch.int64)
        grads = per_image(params, x, y)
        yield torch.cat([grads[n].flatten(1) for n in params], 1)


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


# (key, (G Gᵀ)⁺) of the pool gradients at the received weights. Every update's first alignment point is the weights
# the server sent, the same for every client of a round, and so is the pool: its Gram matrix (O(pool² × parameters),
# the alignment score's costliest step) is computed once per round, not once per update.
_received_projection: dict[str, torch.Tensor] = {}


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


def residual_direction(
    obs: Observation, r: torch.Tensor, point: dict[str, np.ndarray], pool: Auxiliary, received: bool = False
) -> tuple[torch.nn.Module, torch.Tensor]:  # fmt: skip
    """The model at ``point`` and what the client's update holds that neither shadows nor pool explain: the
    :func:`residual` ``r`` with the span of the pool images' gradients at ``point`` projected out (r − Gᵀ(GGᵀ)⁺G r:
    whatever any non-member's gradient could have put there, shadow noise included). ``received``: ``point`` is
    the received weights (the last such projection is remembered: other clients of the round share it)."""
    model = model_with(obs, point).float().eval()
    names = trained_names(obs)
    chosen = evenly(pool.images, pool.labels, projection_pool(model, names))
    g = torch.cat(list(per_sample_gradients(model, *chosen, names)))
    key = projection_key(model, chosen, names) if received else None
    inverse = _received_projection.get(key)  # a None key is never stored
    if inverse is None:
        inverse = torch.linalg.pinv(gram_matrix(g).double(), hermitian=True, rtol=1e-10)
        if key is not None:
            _received_projection.clear()
            _received_projection[key] = inverse
    g = g.double()
    return model, (r - g.T @ (inverse @ (g @ r))).float()


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
        found = [np.concatenate([(g @ direction).double().numpy() for g in per_sample_gradients(model, *side, names)])
                 for side in sides]  # fmt: skip
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


def class_ranks(scores: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """The mid-rank of each score among ``reference``: (#{r < s} + ½ #{r = s}) / len(reference), in [0, 1]."""
    ordered = np.sort(reference)
    below = np.searchsorted(ordered, scores, side="left")
    through = np.searchsorted(ordered, scores, side="right")
    return (below + 0.5 * (through - below)) / len(ordered)


def calibrate(
    member_scores: np.ndarray, non_member_scores: np.ndarray, member_labels: np.ndarray, non_member_labels: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """Both sides' scores as their mid-rank among the non-members of their class (:func:`class_ranks`: the class's
    empirical CDF), so that the pooled AUC is the member-weighted mean of the within-class AUCs (up to the ranks'
    granularity) and a null split centres on 0.5 however skewed a class's scores are (a mean/std standardisation
    does not: with most members in a long-tailed class it gives 0.50 where the within-class AUC is 0.63,
    tests/test_label_distribution.py). A class with fewer than two non-members is ranked among all non-members."""
    # One sort for every class: each score becomes its rank among all scores, keyed by class (class × n + rank), so a
    # class's non-members are one contiguous run of the sorted keys (the null calls this thousands of times).
    scores = np.concatenate([member_scores, non_member_scores])
    labels = np.concatenate([member_labels, non_member_labels]).astype(np.int64)
    order = np.unique(scores, return_inverse=True)[1].astype(np.int64)
    span = len(scores) + 1
    keys = labels * span + order
    reference = np.sort(keys[len(member_scores):])
    classes, of_class = np.unique(labels, return_inverse=True)
    starts = np.searchsorted(reference, classes * span, "left")
    first, count = starts[of_class], (np.searchsorted(reference, classes * span + span, "left") - starts)[of_class]
    by_key = np.argsort(keys, kind="stable")  # sorted queries: searchsorted walks the reference once
    below, through = np.empty(len(keys), np.int64), np.empty(len(keys), np.int64)
    below[by_key] = np.searchsorted(reference, keys[by_key], "left")
    through[by_key] = np.searchsorted(reference, keys[by_key], "right")
    below, tied = below - first, through - below
    ranks = (below + 0.5 * tied) / np.maximum(count, 1)
    few = count < 2  # ranked among all non-members
    if few.any():
        ranks[few] = class_ranks(scores[few], non_member_scores)
    return ranks[: len(member_scores)], ranks[len(member_scores) :]


def fpr_resolution(member_labels: np.ndarray, non_member_labels: np.ndarray) -> tuple[float, int]:
    """The lowest FPR the calibrated scores resolve, and the fewest non-members any member's class is ranked among.
    A calibrated score is a rank among its class's n_c non-members (:func:`calibrate`), so it moves in steps of
    1/n_c: below 1/min n_c a threshold can no longer tell the members of the smallest class apart, and every member
    above all its class's non-members ties at the top (so TPR at 0.1% equalled TPR at 1% with ~93 per class)."""
    counts = [int(np.sum(non_member_labels == c)) for c in np.unique(member_labels)]
    counts = [n if n >= 2 else len(non_member_labels) for n in counts]  # ranked among all non-members (calibrate)
    fewest = min(counts) if counts else len(non_member_labels)
    return 1.0 / max(fewest, 1), fewest


def operating_point(fpr: np.ndarray, tpr: np.ndarray, target: float) -> tuple[float, float]:
    """The highest TPR at an FPR no larger than ``target`` (the ROC's step function) and the FPR it is reached at."""
    within = fpr <= target + 1e-12
    if not within.any():
        return 0.0, 0.0
    best = int(np.argmax(np.where(within, tpr, -1.0)))
    return float(tpr[best]), float(fpr[best])


def resolved(target: float, resolution: float) -> bool:
    """Whether an FPR ``target`` is at or above the resolution (:func:`fpr_resolution`)."""
    return target >= resolution - 1e-12


def split_roc(member_scores: np.ndarray, non_member_scores: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """The ROC curve (FPR, TPR) of members (positive) against non-members, a higher score meaning member, with a
    point at every distinct score (none dropped: a collinear threshold can be the best one below an FPR target),
    and its AUC (the trapezoid rule: the Mann–Whitney statistic, ties counted half). Written out, as a sort and two
    cumulative sums, for the thousands of calls behind a null."""
    scores = np.concatenate([member_scores, non_member_scores])
    is_member = np.concatenate([np.ones(len(member_scores)), np.zeros(len(non_member_scores))])
    order = np.argsort(-scores, kind="stable")
    scores, is_member = scores[order], is_member[order]
    ends = np.r_[np.flatnonzero(np.diff(scores)), len(scores) - 1]  # the last image at each distinct score
    true_positives = np.cumsum(is_member)[ends]
    tpr = np.r_[0.0, true_positives / max(len(member_scores), 1)]
    fpr = np.r_[0.0, (ends + 1 - true_positives) / max(len(non_member_scores), 1)]
    return fpr, tpr, float(np.sum(np.diff(fpr) * (tpr[1:] + tpr[:-1])) / 2)


def needs(target: float) -> int:
    """Non-members per class that resolve an FPR of ``target``."""
    return math.ceil(1.0 / target - 1e-9)


def roc_figures(member_scores: np.ndarray, non_member_scores: np.ndarray, resolution: float = 0.0) -> dict[str, Any]:
    """ROC AUC, TPR at each of :data:`FPRS` that ``resolution`` (:func:`fpr_resolution`) allows (None below it)
    and TPR at the resolution itself (members positive, a higher score meaning member)."""
    fpr, tpr, auc = split_roc(member_scores, non_member_scores)
    figures: dict[str, Any] = {"auc": auc}
    for f in FPRS:
        figures[f"tpr@{f:g}"] = operating_point(fpr, tpr, f)[0] if resolved(f, resolution) else None
    return figures | {"tpr@resolution": operating_point(fpr, tpr, max(resolution, 0.0))[0]}


def intervals(member_scores: np.ndarray, non_member_scores: np.ndarray, resolution: float) -> dict[str, Any]:
    """Per resolved FPR target (and the resolution): the FPR actually reached, and 95% Clopper–Pearson intervals on
    the TPR (of the members) and on that FPR (of the non-members); per target below the resolution, the
    non-members per class it needs."""
    fpr, tpr, _ = split_roc(member_scores, non_member_scores)
    out: dict[str, Any] = {}
    for name, target in [*((f"{f:g}", f) for f in FPRS), ("resolution", resolution)]:
        if not resolved(target, resolution):
            out[f"tpr@{name}-needs"] = needs(target)
            continue
        rate, reached = operating_point(fpr, tpr, target)
        out[f"tpr@{name}-ci"] = clopper_pearson(round(rate * len(member_scores)), len(member_scores))
        out[f"fpr@{name}"] = reached
        out[f"fpr@{name}-ci"] = clopper_pearson(round(reached * len(non_member_scores)), len(non_member_scores))
    return out


def clopper_pearson(successes: int, trials: int, confidence: float = CONFIDENCE) -> list[float]:
    """The exact (Clopper–Pearson) interval of a binomial proportion."""
    from scipy.stats import binomtest

    if trials == 0:
        return [0.0, 1.0]
    found = binomtest(int(successes), int(trials)).proportion_ci(confidence, method="exact")
    return [float(found.low), float(found.high)]


@dataclasses.dataclass(frozen=True)
class Score:
    """One membership score of an update's candidates, a higher value meaning member: its name, how it was
    computed, its raw values on the members and on the non-members, and whether it is judged calibrated per class
    (:func:`calibrate`) or as it is (one threshold for every class, as the plain loss attack sets it)."""

    name: str
    reference: str
    members: np.ndarray
    non_members: np.ndarray
    per_class: bool = True

    def judged(self, member_labels: np.ndarray, non_member_labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The values the figures are read from: calibrated per class, or raw."""
        if not self.per_class:
            return self.members, self.non_members
        return calibrate(self.members, self.non_members, member_labels, non_member_labels)

    def fitted(self, member_labels: np.ndarray, non_member_labels: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """Both sides' values as z-scores under a Gaussian fitted to the non-members of their class (LiRA's offline
        test, Carlini et al., arXiv 2112.03570): a calibration that reaches below one over the class's non-members.
        None for a score judged raw, or where a member's class has fewer than :data:`FIT_MINIMUM` non-members."""
        if not self.per_class:
            return None
        classes = int(max(member_labels.max(initial=0), non_member_labels.max(initial=0))) + 1
        count = np.bincount(non_member_labels, minlength=classes).astype(float)
        if (count[np.unique(member_labels)] < FIT_MINIMUM).any():
            return None
        mean = np.bincount(non_member_labels, self.non_members, classes) / np.maximum(count, 1)
        spread = np.bincount(non_member_labels, (self.non_members - mean[non_member_labels]) ** 2, classes)
        spread = np.sqrt(spread / np.maximum(count - 1, 1)) + 1e-12
        return ((self.members - mean[member_labels]) / spread[member_labels],
                (self.non_members - mean[non_member_labels]) / spread[non_member_labels])  # fmt: skip

    def resplit(self, is_member: np.ndarray) -> Score:
        """The same values on another member/non-member split of the pooled candidates (a null's shuffle)."""
        pooled = np.concatenate([self.members, self.non_members])
        return dataclasses.replace(self, members=pooled[is_member], non_members=pooled[~is_member])


@dataclasses.dataclass(frozen=True)
class RoundsScore:
    """One score over a client's captured updates, on the same candidates in each: per update its values ranked
    among the non-members (of their class where the score is calibrated, else of all), as normal quantiles, summed
    and divided by √R (Stouffer's combination): an image the client trains on in every round adds up its
    evidence, as FedMIA combines a client's updates across rounds (Zhu et al., arXiv 2402.06289)."""

    name: str
    reference: str
    parts: tuple[Score, ...]
    per_class: bool = True

    def judged(self, member_labels: np.ndarray, non_member_labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        members, non_members = np.zeros(len(member_labels)), np.zeros(len(non_member_labels))
        floor = 0.5 / max(len(non_member_labels), 1)  # a rank of 0 or 1 is the edge of what the non-members tell
        for part in self.parts:
            if part.per_class:
                ranks = part.judged(member_labels, non_member_labels)
            else:
                ranks = class_ranks(part.members, part.non_members), class_ranks(part.non_members, part.non_members)
            members += ndtri(np.clip(ranks[0], floor, 1 - floor))  # the normal quantile
            non_members += ndtri(np.clip(ranks[1], floor, 1 - floor))
        return members / math.sqrt(len(self.parts)), non_members / math.sqrt(len(self.parts))

    def fitted(self, member_labels: np.ndarray, non_member_labels: np.ndarray) -> None:
        """No parametric fit: a combination of ranks has no per-class Gaussian to fit."""
        return None

    def resplit(self, is_member: np.ndarray) -> RoundsScore:
        return dataclasses.replace(self, parts=tuple(p.resplit(is_member) for p in self.parts))


def score_figures(
    score: Score | RoundsScore, member_labels: np.ndarray, non_member_labels: np.ndarray, resolution: float
) -> dict[str, Any]:  # fmt: skip
    """:func:`roc_figures` of the score's judged values, and the TPR at 0.1% FPR of its Gaussian fit
    (:meth:`Score.fitted`; None without one)."""
    found = roc_figures(*score.judged(member_labels, non_member_labels), resolution)
    fit = score.fitted(member_labels, non_member_labels)
    return found | {PARAMETRIC: None if fit is None else float(np.mean(fit[0] > ndtri(1 - FPRS[0])))}


def over_rounds(updates: list[list[Score]]) -> list[RoundsScore]:
    """Each score that every one of a client's updates has, combined over them (:class:`RoundsScore`)."""
    names = [s.name for s in updates[0] if all(any(o.name == s.name for o in u) for u in updates)]
    found = [[next(s for s in u if s.name == name) for u in updates] for name in names]
    return [RoundsScore(name, f"{parts[0].reference}, over {len(parts)} update(s)", tuple(parts), parts[0].per_class)
            for name, parts in zip(names, found, strict=True)]  # fmt: skip


def within_class_shuffles(is_member: np.ndarray, classes: np.ndarray, draws: int, seed: int) -> Iterator[np.ndarray]:
    """``draws`` member masks, each ``is_member`` permuted within every class (the nulls' control: the class
    composition of both sides stays, membership is at random)."""
    rng = np.random.default_rng(seed)
    groups = [np.flatnonzero(classes == c) for c in np.unique(classes)]
    for _ in range(draws):
        shuffled = is_member.copy()
        for group in groups:
            shuffled[group] = rng.permutation(is_member[group])
        yield shuffled


def null_figures(
    scores: list[Score] | list[RoundsScore], member_labels: np.ndarray, non_member_labels: np.ndarray, seed: int = 0
) -> list[dict[str, Any]]:  # fmt: skip
    """Per score, the null of each figure across :data:`NULL_DRAWS` shuffles of the member/non-member labels within
    each class, every score judged on each draw as on the real split (calibrated on the draw's own non-members
    where it is calibrated). Several scores are one family (Westfall and Young's max-T): each figure is
    standardised by its score's own draws (mean, spread), the family's threshold is the :data:`NULL_QUANTILE` of the
    largest standardised figure across the scores in each draw, and each score's null is that threshold in its own
    units, so choosing the strongest of k scores does not inflate the evidence and no score's null is set by
    another's (one score alone: the plain quantile). The class composition of the two sides stays, so a score that
    only tells the client's frequent classes from the population's (its label distribution, a noised model's class
    bias, the raw loss of a class-skewed client) is in its null, not counted as membership. The shuffles keep each
    class's non-member count: the null has the real split's resolution (None where a target is below it)."""
    classes = np.concatenate([member_labels, non_member_labels])
    is_member = np.concatenate([np.ones(len(member_labels), bool), np.zeros(len(non_member_labels), bool)])
    resolution, _ = fpr_resolution(member_labels, non_member_labels)
    draws = []  # [draw][score] -> figures
    for shuffled in within_class_shuffles(is_member, classes, NULL_DRAWS, seed):
        labels = classes[shuffled], classes[~shuffled]
        draws.append([score_figures(s.resplit(shuffled), *labels, resolution) for s in scores])
    nulls: list[dict[str, Any]] = [dict.fromkeys(draws[0][0]) for _ in scores]
    for figure in draws[0][0]:  # a figure a score lacks (below the resolution, no fit) is None in every draw
        present = [k for k in range(len(scores)) if draws[0][k][figure] is not None]
        if not present:
            continue
        found = np.array([[d[k][figure] for k in present] for d in draws])  # [draws, scores]
        if len(present) == 1:
            nulls[present[0]][figure] = float(np.quantile(found[:, 0], NULL_QUANTILE))
            continue
        centre, spread = found.mean(0), np.maximum(found.std(0), 1e-12)
        threshold = np.quantile(((found - centre) / spread).max(1), NULL_QUANTILE)
        for j, k in enumerate(present):
            nulls[k][figure] = float(centre[j] + threshold * spread[j])
    return nulls


def clears_null(figures: dict[str, Any], null: dict[str, Any]) -> bool:
    """A finding: AUC beyond its null, and TPR beyond its null at 1% FPR where resolved, else at the resolution."""
    at = "tpr@0.01" if figures["tpr@0.01"] is not None else "tpr@resolution"
    return figures["auc"] > null["auc"] and figures[at] > null[at]


def judge(
    scores: list[Score] | list[RoundsScore], candidates: Candidates, seed: int = 0, delta: float | None = None
) -> tuple[dict[str, Any], np.ndarray, np.ndarray]:  # fmt: skip
    """Membership figures of one update from its strongest score against that score's null within the family
    (:func:`null_figures`): the score with the highest AUC among those that clear their null, else the highest AUC
    of all; every score's figures and null beside it; with a ``delta``, the ε the family proves
    (:func:`privacy_bound`). Returns them and the strongest score's judged values on the members and non-members
    (``scores`` were taken on ``candidates``, at most :data:`MAX_CANDIDATES` per side)."""
    member_labels, non_member_labels = evenly(*candidates.members)[1], evenly(*candidates.non_members)[1]
    resolution, fewest = fpr_resolution(member_labels, non_member_labels)
    judged = [s.judged(member_labels, non_member_labels) for s in scores]
    each = [score_figures(s, member_labels, non_member_labels, resolution) for s in scores]
    nulls = null_figures(scores, member_labels, non_member_labels, seed)
    cleared = [clears_null(f, n) for f, n in zip(each, nulls, strict=True)]
    best = max(range(len(scores)), key=lambda k: (cleared[k], each[k]["auc"]))
    inside, outside = judged[best]
    result = {
        "members": len(inside),
        "non-members": len(outside),
        "non-member-source": candidates.source,
        "score": scores[best].name,
        "reference": scores[best].reference,
        **each[best],
        **intervals(inside, outside, resolution),
        "null": nulls[best],
        "clears-null": cleared[best],
        "fpr-resolution": resolution,  # after calibration: 1 / the fewest non-members of a member's class
        "non-members-per-class": fewest,
        "scores": {
            s.name: {**{k: f[k] for k in ("auc", "tpr@0.01", "tpr@resolution", PARAMETRIC)}, "null": n,
                     "clears-null": c, "per-class": s.per_class}
            for s, f, n, c in zip(scores, each, nulls, cleared, strict=True)
        },  # fmt: skip
    }
    if (fit := scores[best].fitted(member_labels, non_member_labels)) is not None:
        result["fit-check"] = fit_check(fit[1])
    if delta is not None:
        result["empirical-epsilon"] = privacy_bound(scores, member_labels, non_member_labels, candidates.canaries,
                                                    delta, seed)  # fmt: skip
    return result, inside, outside


def fit_check(non_members: np.ndarray, target: float = FPRS[1]) -> dict[str, Any]:
    """The per-class Gaussian fit against the empirical CDF where both apply: the share of non-members its ``target``
    FPR threshold passes, with its Clopper–Pearson interval; the fit agrees when the interval holds ``target``."""
    passed = int(np.sum(non_members > ndtri(1 - target)))
    low, high = clopper_pearson(passed, len(non_members))
    return {"target": target, "found": passed / max(len(non_members), 1), "ci": [low, high],
            "agrees": bool(low <= target <= high)}  # fmt: skip


def exchangeable_sides(
    member_labels: np.ndarray, non_member_labels: np.ndarray, canaries: bool, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """Indices of the members and of the non-members that the ε bound compares: sides that are draws of one
    distribution when the update holds nothing about its records, as the DP inequalities need. Canaries are included
    at random: all of them. Natural members: of each class, as many members and non-members as the rarer side has
    (drawn at random, independently of any score), so both sides have the same class composition and a score that
    tells classes apart tells the sides apart no more than chance."""
    if canaries:
        return np.arange(len(member_labels)), np.arange(len(non_member_labels))
    rng = np.random.default_rng([seed, 7])
    members, non_members = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
    for c in np.intersect1d(member_labels, non_member_labels):
        inside, outside = np.flatnonzero(member_labels == c), np.flatnonzero(non_member_labels == c)
        k = min(len(inside), len(outside))
        members.append(rng.choice(inside, k, replace=False))
        non_members.append(rng.choice(outside, k, replace=False))
    return np.sort(np.concatenate(members)), np.sort(np.concatenate(non_members))


def privacy_bound(
    scores: list[Score], member_labels: np.ndarray, non_member_labels: np.ndarray,
    canaries: bool, delta: float, seed: int = 0,
) -> dict[str, Any]:  # fmt: skip
    """The :func:`empirical_epsilon` of the family's raw values on :func:`exchangeable_sides`, and its null: the
    largest bound over :data:`EPSILON_NULL_DRAWS` shuffles of the same sides' member/non-member labels within each
    class (a control that holds no information, through the same code). Raw values, not the per-class ranks the
    other figures use: on sides of one class composition raw values are exchangeable as they are, a rank is not (a
    member's rank among its class's n non-members moves from 0 to 1 in steps of 1/n, a non-member's from ½/n to
    1 − ½/n). Ranks on the unmatched sides, as the bound once took them, "proved" ε up to 2.5 on no-information
    controls (tests/test_label_distribution.py). Scores whose raw values repeat another's are counted once."""
    if any(isinstance(s, RoundsScore) for s in scores):
        raise ValueError("the empirical ε is a bound on one update's release: judge it on per-update scores")
    inside, outside = exchangeable_sides(member_labels, non_member_labels, canaries, seed)
    family: list[Score] = []
    for s in scores:
        if not any(np.array_equal(s.members, o.members) and np.array_equal(s.non_members, o.non_members)
                   for o in family):  # fmt: skip
            family.append(s)
    values = [(s.members[inside], s.non_members[outside]) for s in family]
    found = empirical_epsilon(values, delta)
    labels = np.concatenate([member_labels[inside], non_member_labels[outside]])
    is_member = np.r_[np.ones(len(inside), bool), np.zeros(len(outside), bool)]
    pooled = [np.concatenate(v) for v in values]
    null, draws = 0.0, EPSILON_NULL_DRAWS if len(inside) and len(outside) else 0
    for shuffled in within_class_shuffles(is_member, labels, draws, seed):
        drawn = empirical_epsilon([(p[shuffled], p[~shuffled]) for p in pooled], delta)
        null = max(null, drawn["epsilon-lower"])
    return found | {"null": null, "null-draws": draws, "members": len(inside),
                    "non-members": len(outside), "scores": [s.name for s in family]}  # fmt: skip


def empirical_epsilon(judged: list[tuple[np.ndarray, np.ndarray]], delta: float,
                      confidence: float = CONFIDENCE) -> dict[str, Any]:  # fmt: skip
    """A lower bound on the ε of any (ε, δ)-DP training that the membership test refutes below it. A threshold test
    of (ε, δ)-DP training has TPR ≤ e^ε FPR + δ and TNR ≤ e^ε FNR + δ (Kairouz et al., ICML 2015), so
    ε ≥ ln((TPR − δ) / FPR) and ε ≥ ln((TNR − δ) / FNR) (Jagielski et al., arXiv 2006.07709; Nasr et al., arXiv
    2101.04535). Each rate is taken at its Clopper–Pearson bound (TPR, TNR from below; FPR, FNR from above) with
    the error ``1 − confidence`` split over every threshold of every score examined and both bounds (Bonferroni),
    so the largest ε over them holds at ``confidence``. ``judged``: each score's values on members and non-members."""
    from scipy.stats import beta

    counts = []
    for members, non_members in judged:
        fpr, tpr, _ = split_roc(members, non_members)
        counts.append((np.round(tpr * len(members)), len(members), np.round(fpr * len(non_members)), len(non_members)))
    tests = sum(len(c[0]) for c in counts)
    alpha = (1 - confidence) / (2 * max(tests, 1))
    best, at = 0.0, None
    for true_pos, n1, false_pos, n0 in counts:
        tpr_low = np.nan_to_num(beta.ppf(alpha, true_pos, n1 - true_pos + 1))  # 0 positives: bound 0
        fpr_high = np.nan_to_num(beta.ppf(1 - alpha, false_pos + 1, n0 - false_pos), nan=1.0)
        tnr_low = np.nan_to_num(beta.ppf(alpha, n0 - false_pos, false_pos + 1))
        fnr_high = np.nan_to_num(beta.ppf(1 - alpha, n1 - true_pos + 1, true_pos), nan=1.0)
        for high_rate, low_rate in ((tpr_low, fpr_high), (tnr_low, fnr_high)):
            with np.errstate(divide="ignore", invalid="ignore"):
                found = np.where(high_rate > delta, np.log((high_rate - delta) / low_rate), 0.0)
            k = int(np.argmax(found))
            if found[k] > best:
                best, at = float(found[k]), {"tpr": float(true_pos[k] / n1), "fpr": float(false_pos[k] / n0)}
    return {"epsilon-lower": best, "delta": delta, "confidence": confidence, "thresholds": tests, "at": at}


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


def simulated_power(
    obs: Observation, pool: Auxiliary, counts: np.ndarray, momentum: float, seed: int, non_members: int
) -> dict[str, Any]:  # fmt: skip
    """Membership in an update like this one where membership is known: the client's local training simulated from
    the received weights with its recipe, ``momentum`` and the estimated class ``counts`` on images drawn from
    ``pool`` (the label estimate's simulation), then judged as the real update is, by the loss scores
    (:data:`LOSS_SCORES`), with the drawn images as members and up to ``non_members`` other pool images (as many as
    the real split scores: the same resolution) as non-members. What the audit could detect in such an update."""
    simulation = simulate(obs, pool, counts, momentum, seed, keep_weights=True, private=True)
    trained = np.unique(simulation.drawn[simulation.drawn >= 0])
    rest = np.setdiff1d(np.arange(len(pool.images)), trained)
    rest = rest[evenly_spaced(len(rest), non_members)] if len(rest) > non_members else rest
    candidates = Candidates((pool.images[trained], pool.labels[trained]), (pool.images[rest], pool.labels[rest]),
                            f"{len(rest)} other images of {pool.source}")  # fmt: skip
    simulated_update = dataclasses.replace(obs, update=simulation.weights)
    found, _, _ = judge(loss_scores(candidate_losses(simulated_update, candidates)), candidates, seed)
    return found


def infer(
    obs: Observation, candidates: Candidates, seed: int = 0,
    shadows: list[Simulation] | None = None, pool: Auxiliary | None = None,
) -> tuple[dict[str, Any], np.ndarray, np.ndarray]:  # fmt: skip
    """One score judged alone (:func:`judge`): :func:`alignment_score` against ``shadows``
    (:func:`reference_updates`) trained on ``pool``, images that are none of the candidates
    (:func:`split_for_references`), else :func:`loss_drop_score`."""
    if shadows and pool is None:
        raise ValueError("shadow updates need the pool they were trained on (split_for_references)")
    if shadows:
        return judge([alignment_score(obs, candidates, shadows, pool)], candidates, seed)
    return judge([loss_drop_score(candidate_losses(obs, candidates))], candidates, seed)


def save_roc(curves: list[tuple[str, np.ndarray, np.ndarray]], path: Path) -> None:
    """Log-log ROC curves (one per update; the diagonal is chance), as Carlini et al. plot them."""
    from fedvit.core.plots import plt

    if not curves:
        return
    fig, ax = plt.subplots(figsize=(4, 4))
    for label, inside, outside in curves:
        fpr, tpr, _ = split_roc(inside, outside)
        ax.plot(np.maximum(fpr, 1e-5), np.maximum(tpr, 1e-5), label=label, lw=1)
    ax.plot([1e-5, 1], [1e-5, 1], "k--", lw=0.7, label="chance")
    ax.set(xscale="log", yscale="log", xlabel="false positive rate", ylabel="true positive rate",
           xlim=(1e-4, 1), ylim=(1e-4, 1), title="membership inference (per update)")  # fmt: skip
    ax.legend(fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.16))  # below: long update names fit
    fig.savefig(path, dpi=130, bbox_inches="tight")
    plt.close(fig)
