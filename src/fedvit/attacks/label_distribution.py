"""Label distribution of a multi-step FedAvg update: how many images of each class the client trained on.

An RLU-class method (Chen & Vikalo, "Recovering Labels from Local Updates in Federated Learning", ICML 2024,
arXiv 2405.00955): least squares on the output layer's update, with the softmax the model put on every class
during the client's local training estimated by simulating that training on auxiliary data.

With softmax cross-entropy averaged over each batch and SGD with momentum β (PyTorch's form, no dampening), the
head bias moves by  w_received − w_sent = lr Σ_t w_t g_t,  g_t = (1/B_t) Σ_{i∈t} (p_i − y_i),
w_t = (1 − β^{T−t+1}) / (1 − β). Grouping the images of step t by their class k and taking expectations over
the client's shuffling (a class-k image is in any batch with probability B_t/N) gives

    (I − P̄) n = N (b_sent − b_received) / (lr W),   W = Σ_t w_t,

where n are the per-class counts of the client's N images and P̄[c, k] the w_t/B_t-weighted mean softmax of class
c over the class-k images seen during training. P̄ is what the eavesdropper does not see: it is taken from a
simulation of the same T steps (batch size, lr, momentum) on auxiliary images drawn with the current estimate of
n, in :data:`PASSES` passes (each estimate sets the next pass's class mix). The head's weight rows add the same
relation with the class-mean head inputs (see :func:`simulate`). n ≥ 0 and Σn = N (the reply's num-examples)
close the system (I − P̄ is singular: its columns sum to zero).

Passes alone (each estimate setting the next simulation's class mix) are a fixed-point iteration that stalls beyond
one epoch on skewed classes: the simulated model learns whatever class prior it is given, so every mix looks
nearly self-consistent and the estimate stays near its uniform start (error near the prior's). So the passes only
start a Gauss–Newton search on the self-consistency residual r(n) = (S(n) n − rhs) / ‖rhs‖, S(n) the system of a
simulation at mix n, its Jacobian by finite differences (one simulation per class, the same shuffling seed
throughout); see :func:`residual_search`. The residual is not convex in n, so a second search starts from the
class shares the sent model predicts on the auxiliary images (:func:`learned_mix`), and the lower residual wins.
Where no record carries the momentum, the passes run under each plausible value and the one whose simulated head
change is closest in norm to the observed one is searched; the counts under the other values (one search step
from their own passes) are reported beside it.

The null is the prior: the counts a guess without the update makes (the auxiliary data's class shares times N);
under IID partitions the truth is close to it and matching it shows nothing. Measured accuracy: see
:data:`BENCHMARKED_ERROR` and the docs' audit results (benchmarks/label_distribution.py; the search alone against
the passes and the true mix in benchmarks/label_mix_search.py).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch
import torch.nn.functional as F
from scipy.optimize import nnls

from fedvit.attacks.augmentation import augmented
from fedvit.attacks.local_sgd import ADAMW_WEIGHT_DECAY, DpSgd, local_sgd
from fedvit.attacks.observation import (
    Observation,
    input_shape,
    model_with,
    not_plain_sgd,
    received_model,
    recipe,
    trained_names,
    update_norm,
)
from fedvit.attacks.recipe import ADAM_FAMILY, SIMULATED_OPTIMISERS
from fedvit.core.model import classify, normalize

MOMENTA = (0.0, 0.9)  # the values tried when no record carries the momentum (plain SGD; the common default)
PASSES = 3  # simulations per momentum: a uniform class mix, then each estimate sets the next one's
SEARCH_STEPS = 5  # Gauss–Newton steps at most (each: one simulation per class, then up to 3 for the step length)
SIDE_SEARCH_STEPS = 1  # for the counts under the other momentum and under weight decay (their sensitivity)
FD_SHARE = 0.05  # finite-difference step of the Jacobian: this share of the client's images moved into one class
CONVERGED = 0.005  # a step that moves fewer than this share of the images ends the search
WEIGHT_DECAY = 5e-4  # the common value, tried beside 0 for another app's update (no record carries it)
SUM_WEIGHT = 10.0  # weight of the Σn = N row against the C rows of the least squares
# Label-count error (1 − label accuracy) of this method in fedvit's own benchmark, by model family and local
# epochs: the worst over IID and five Dirichlet(0.5) draws and 1,000 or 2,000 images per client, B = 32, lr 0.01,
# momentum 0.9 on no record. Measured 2026-11-26 (commit f82b26f) with
# `uv run python -m benchmarks.label_distribution --workers 2` (docs/results/data/label-distribution.csv);
# tests/test_label_distribution.py checks that the two agree. The prior misplaces 27-47% on those skewed clients.
BENCHMARKED_ERROR = {"cnn": {1: 0.04, 3: 0.14, 5: 0.3}, "vit": {1: 0.13, 3: 0.16, 5: 0.17}}
# The same for an Adam client (lr 0.001, torch's defaults; on record), whose update this method's SGD relation does
# not describe: the worst over IID and two Dirichlet(0.5) draws, 1,000 images, B = 32 — worse than the prior's on
# the skewed clients after 1 epoch. `uv run python -m benchmarks.adam_vs_sgd --workers 2` (adam-vs-sgd.csv)
ADAM_ERROR = {"cnn": {1: 0.49, 3: 0.33}}


@dataclasses.dataclass(frozen=True)
class Auxiliary:
    """Images [n, C, H, W] in [0, 1] with labels, none of them the client's: what the attacker simulates with."""

    images: np.ndarray
    labels: np.ndarray
    source: str
    noise: np.ndarray | None = None  # inputs standing in for a class none of the images has (None: fresh noise)

    def prior(self, num_classes: int) -> np.ndarray:
        """Class shares of the auxiliary data (the population's, as far as the attacker knows it)."""
        counts = np.bincount(self.labels, minlength=num_classes)[:num_classes].astype(np.float64)
        return counts / counts.sum() if counts.sum() else np.full(num_classes, 1 / num_classes)


@dataclasses.dataclass(frozen=True)
class LabelEstimate:
    """The counts, the momentum the simulation used and the counts under every other momentum tried."""

    counts: np.ndarray
    momentum: float
    note: str
    alternatives: dict[float, np.ndarray]
    momentum_estimate: str = ""  # how the optimiser or momentum was inferred from the update ("" where stated)
    optimiser: str = "sgd"  # the optimiser the simulation ran
    fit: RecipeFit | None = None  # how well that simulation reproduces the update


def step_weights(steps: int, momentum: float) -> np.ndarray:
    """w_t = (1 − β^{T−t+1}) / (1 − β): how much of step t's gradient the T momentum steps applied in total."""
    if momentum == 0:
        return np.ones(steps)
    remaining = np.arange(steps, 0, -1)
    return (1 - momentum**remaining) / (1 - momentum)


def noise_auxiliary(shape: tuple[int, int, int], num_classes: int, seed: int, per_class: int = 16) -> Auxiliary:
    """Uniform-noise images with every class's label: a simulation without any data of the task (weak)."""
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(num_classes), per_class)
    return Auxiliary(rng.random((len(labels), *shape)), labels, "uniform-noise images (no auxiliary data)")


def integer_counts(raw: np.ndarray, total: int) -> np.ndarray:
    """Non-negative integers summing to ``total``, by largest remainders of ``raw`` (rescaled to ``total``)."""
    raw = np.clip(np.asarray(raw, np.float64), 0, None)
    raw = raw * (total / raw.sum()) if raw.sum() > 0 else np.full(len(raw), total / len(raw))
    counts = np.floor(raw).astype(np.int64)
    counts[np.argsort(-(raw - counts), kind="stable")[: total - int(counts.sum())]] += 1
    return counts


def solve_counts(system: np.ndarray, rhs: np.ndarray, total: int) -> np.ndarray:
    """Least squares ``system`` n ≈ rhs with n ≥ 0 and Σn = N (a row weighted like the system's largest), as real
    counts."""
    c = system.shape[1]
    weight = SUM_WEIGHT * max(float(np.abs(system).max()), 1e-12)
    a = np.vstack([system, weight * np.ones((1, c))])
    b = np.concatenate([rhs, [weight * total]])
    return nnls(a, b, maxiter=50 * c)[0]


@dataclasses.dataclass(frozen=True)
class Simulation:
    """One simulated local training, as the rows of the linear system in the counts n: ``system`` [R, C] such that
    ``system @ n ≈ N (w_sent − w_received) / (lr W)`` (:func:`scaled_rhs`) stacked over the head's bias and weight
    rows; and the norm of the head's simulated change."""

    system: np.ndarray
    head_change: float
    weights: dict[str, np.ndarray] | None = None  # the simulated client's final state dict (``keep_weights``)
    snapshots: list[dict[str, np.ndarray]] = dataclasses.field(default_factory=list)  # parameters (``snapshots``)
    drawn: np.ndarray | None = None  # the auxiliary images it trained on, by index (-1: noise for a class aux lacks)
    head_delta: np.ndarray | None = None  # the head's simulated change, laid out as :func:`head_rows`
    update_norm: float = math.nan  # ‖w_end − w_received‖ over every trained parameter


def head_module(model: torch.nn.Module, bias: str) -> torch.nn.Module:
    """The module that owns the head's bias (``fc3.bias`` → ``fc3``)."""
    return model.get_submodule(bias.removesuffix(".bias"))


def simulate(
    obs: Observation, aux: Auxiliary, counts: np.ndarray, momentum: float, seed: int, weight_decay: float = 0.0,
    keep_weights: bool = False, snapshots: int = 0, private: bool = False,
) -> Simulation:  # fmt: skip
    """The client's T local steps (its batch size, lr, momentum) from the received weights on auxiliary images:
    ``counts`` images per class, each drawn once from the auxiliary images of its class and revisited every epoch.

    Per class k it averages, weighted by w_t / B_t over the class-k images it trains on: their softmax (P̄[:, k]),
    their head inputs h (F_k) and p_c·h (M[c, k]). With n_k/N of every batch from class k, row c of the head
    moves by  w_sent − w_received ≈ lr W/N · Σ_k n_k (δ_ck [1, F_k] − [P̄[c, k], M[c, k]]):  the system returned
    holds those coefficients (bias row first, then the weight rows, per class).

    ``private``: the steps are DP-SGD's where the client claims it (noise multiplier and clipping norm on record),
    and the clipped update gets LocalDpMod's noise where it claims that: what a shadow update or the power twin must
    repeat. The label estimate's own simulations run the plain steps — its relation is SGD's update, marked
    unverified under DP-SGD — at a fraction of the cost (no per-image gradients).
    """
    client = recipe(obs)
    rng = np.random.default_rng(seed)
    generator = torch.Generator().manual_seed(seed)
    views = torch.Generator().manual_seed(seed + 1)  # the declared augmentation's draws (a fresh view per visit)
    model = received_model(obs).float().train()
    features: list[torch.Tensor] = []
    recording = [True]  # off while DP-SGD's per-image gradients run (vmapped tensors must not leave the transform)
    hook = head_module(model, obs.head_bias).register_forward_hook(
        lambda m, i, o: features.append(i[0].detach()) if recording[0] else None)  # fmt: skip
    classes = len(counts)
    labels = np.repeat(np.arange(classes), counts)
    by_class = {k: np.flatnonzero(aux.labels == k) for k in range(classes)}
    shape = input_shape(obs)
    drawn, pool = np.full(len(labels), -1, dtype=np.int64), []
    for j, k in enumerate(labels):  # one draw per image, in label order (a class aux lacks: noise)
        if len(by_class[k]):
            drawn[j] = rng.choice(by_class[k])
            pool.append(aux.images[drawn[j]])
        elif aux.noise is not None:
            pool.append(aux.noise[rng.integers(len(aux.noise))])
        else:
            pool.append(rng.random(shape))
    images = torch.as_tensor(np.stack(pool), dtype=torch.float32)
    targets = torch.as_tensor(labels)
    bias, weight = obs.head_bias, head_weight(obs.head_bias)
    trained = set(trained_names(obs))  # a partial update: the frozen layers stay as received
    params = {n: p.detach() for n, p in model.named_parameters() if n in trained}
    per_epoch = math.ceil(len(labels) / client.batch)
    weights = step_weights(per_epoch * client.epochs, momentum)
    seen, probs_sum, feat_sum, cross_sum = np.zeros(classes), None, None, None
    kept = []
    snapshot_steps = set(np.linspace(0, per_epoch * client.epochs, snapshots, endpoint=False).round().astype(int))
    schedule = [  # (step, batch): the client's shuffled order, drawn afresh every epoch
        (epoch * per_epoch + k, order[first : first + client.batch])
        for epoch, order in enumerate(torch.randperm(len(labels), generator=generator) for _ in range(client.epochs))
        for k, first in enumerate(range(0, len(labels), client.batch))
    ]

    def batch_loss(current: dict[str, torch.Tensor], step_batch: tuple[int, torch.Tensor]) -> torch.Tensor:
        """The step's cross-entropy; records the step's softmax and head inputs per class on the way."""
        nonlocal probs_sum, feat_sum, cross_sum
        step, batch = step_batch
        if step in snapshot_steps:
            kept.append({n: w.detach().numpy().copy() for n, w in current.items()})
        features.clear()
        x = images[batch] if client.augment is None else augmented(images[batch], client.augment, views)
        inputs[:] = [x, targets[batch]]
        logits = torch.func.functional_call(model, current, (normalize(model, x),))
        scale = weights[step] / len(batch)
        probs = torch.softmax(logits.detach().double(), 1).numpy()
        h = features[-1].double().flatten(1).numpy()
        y = targets[batch].numpy()
        if probs_sum is None:
            probs_sum = np.zeros((classes, classes))
            feat_sum = np.zeros((classes, h.shape[1]))
            cross_sum = np.zeros((classes, classes, h.shape[1]))
        np.add.at(seen, y, scale)
        np.add.at(probs_sum.T, y, scale * probs)  # column k: the softmax of class-k images
        np.add.at(feat_sum, y, scale * h)
        np.add.at(cross_sum.transpose(1, 0, 2), y, scale * probs[:, :, None] * h[:, None, :])
        return F.cross_entropy(logits, targets[batch])

    inputs: list[torch.Tensor] = []  # the last step's (views of the) images and labels, for DP-SGD

    def per_sample(current: dict[str, torch.Tensor], step_batch: tuple[int, torch.Tensor]) -> dict[str, torch.Tensor]:
        def loss(w: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return F.cross_entropy(torch.func.functional_call(model, w, (normalize(model, x[None]),)), y[None])

        recording[0] = False
        try:
            return torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0, 0))(current, *inputs)
        finally:
            recording[0] = True

    dp_sgd = None
    if private and (claim := client.privacy) is not None and claim.noise_multiplier is not None and claim.clipping_norm:
        for module in model.modules():  # timm's fused attention has no batching rule
            if hasattr(module, "fused_attn"):
                module.fused_attn = False
        dp_sgd = DpSgd(claim.noise_multiplier, claim.clipping_norm, per_sample,
                       torch.Generator().manual_seed(seed + 2))  # fmt: skip
    # an optimiser not simulated: SGD's steps (the counts are then marked unverified; shadows do not run)
    optimiser = client.optimiser if client.optimiser in SIMULATED_OPTIMISERS else "sgd"
    if optimiser == "adamw" and weight_decay == 0:
        weight_decay = ADAMW_WEIGHT_DECAY  # torch's default (no record carries the weight decay)
    end = local_sgd(params, batch_loss, schedule, client.lr, momentum, weight_decay=weight_decay, optimiser=optimiser,
                    dp_sgd=dp_sgd)  # fmt: skip
    if client.update_clip is not None:  # Flower's client-side clipping: the whole update scaled to norm ≤ C
        end = clipped_update(params, end, client.update_clip)
    if private and client.update_noise is not None:  # LocalDpMod: then Gaussian noise on every entry
        draws = torch.Generator().manual_seed(seed + 3)
        end = {n: w + client.update_noise * torch.randn(w.shape, generator=draws, dtype=w.dtype)
               for n, w in end.items()}  # fmt: skip
    hook.remove()
    # per class k, the mean over its occurrences (classes never drawn: the mean over every image seen)
    norm = np.maximum(seen, 1e-12)
    fallback = seen == 0
    p_mean = probs_sum / norm
    f_mean = feat_sum / norm[:, None]
    m_mean = cross_sum / norm[None, :, None]
    p_mean[:, fallback] = (probs_sum.sum(1) / max(seen.sum(), 1e-12))[:, None]
    f_mean[fallback] = feat_sum.sum(0) / max(seen.sum(), 1e-12)
    m_mean[:, fallback] = (cross_sum.sum(1) / max(seen.sum(), 1e-12))[:, None]
    eye = np.eye(classes)
    bias_rows = eye - p_mean  # [c, k]
    weight_rows = eye[:, :, None] * f_mean[None, :, :] - m_mean  # [c, k, d]
    system = np.concatenate([bias_rows[:, None, :], weight_rows.transpose(0, 2, 1)], axis=1).reshape(-1, classes)
    change = math.sqrt(sum(float((end[n].detach() - params[n]).pow(2).sum()) for n in (bias, weight) if n in params))
    moved_all = math.sqrt(sum(float((end[n].detach() - params[n]).pow(2).sum()) for n in end))
    delta = None
    if bias in params and weight in params:  # laid out as head_rows: per class its bias, then its weight row
        moved = [(end[n].detach() - params[n]).double().numpy() for n in (bias, weight)]
        delta = np.concatenate([moved[0].reshape(len(moved[0]), -1), moved[1].reshape(len(moved[0]), -1)], 1)
    final = None
    if keep_weights:  # the state dict: the trained parameters with the model's buffers
        final = {n: t.detach().numpy().copy() for n, t in model.state_dict().items()}
        final.update({n: w.detach().numpy().copy() for n, w in end.items()})
    return Simulation(system, change, final, kept, drawn, None if delta is None else delta.reshape(-1), moved_all)


def clipped_update(start: dict[str, torch.Tensor], end: dict[str, torch.Tensor], bound: float
                   ) -> dict[str, torch.Tensor]:  # fmt: skip
    """``end`` moved back towards ``start`` so that the update's L2 norm over every array is at most ``bound`` (the
    clipping of Flower's ``fixedclipping_mod``: the update scaled by min(1, C / ‖Δ‖))."""
    norm = math.sqrt(sum(float((end[n].detach() - start[n]).pow(2).sum()) for n in end))
    factor = min(1.0, bound / norm) if norm > 0 else 1.0
    return {n: start[n] + (end[n].detach() - start[n]) * factor for n in end}


def head_weight(bias: str) -> str:
    """The head's weight beside its bias (``fc3.bias`` → ``fc3.weight``)."""
    return bias.removesuffix("bias") + "weight"


def head_rows(obs: Observation) -> np.ndarray:
    """w_sent − w_received of the head, per class its bias then its weight row, flattened (the system's
    right-hand side before scaling)."""
    client = recipe(obs)
    names = [obs.head_bias, head_weight(obs.head_bias)]
    moved = {}
    for name in names:
        change = np.asarray(obs.update[name], np.float64) - np.asarray(obs.received[name], np.float64)
        if obs.correction is not None:  # SCAFFOLD moved every step by −lr (c − c_i) as well
            change = change + client.lr * client.steps * obs.correction[name]
        moved[name] = change.reshape(len(change), -1)
    rows = np.concatenate([moved[names[0]], moved[names[1]]], axis=1).reshape(-1)
    if not np.isfinite(rows).all():
        raise ValueError("the head's update holds non-finite values")
    return rows


def scaled_rhs(obs: Observation, rows: np.ndarray, momentum: float) -> np.ndarray:
    """N (w_sent − w_received) / (lr W): the right-hand side the system in the counts must meet."""
    client = recipe(obs)
    return client.examples * rows / (client.lr * float(step_weights(client.steps, momentum).sum()))


def candidate_recipes(obs: Observation) -> list[tuple[str, float]]:
    """(optimiser, SGD momentum) pairs the simulation tries: the recipe's own where its source states both; every
    momentum of :data:`MOMENTA` where only SGD is stated; SGD at each momentum, Adam and AdamW where nothing states
    the optimiser (Adam's steps are near lr per coordinate whatever the gradient's scale, SGD's scale with it: the
    head change they simulate tells them apart)."""
    client = recipe(obs)
    if client.optimiser is None:
        return [("sgd", beta) for beta in MOMENTA] + [(name, 0.0) for name in ADAM_FAMILY]
    if client.optimiser == "sgd" and not client.momentum_known:
        return [("sgd", beta) for beta in MOMENTA]
    return [(client.optimiser, client.momentum)]


def with_optimiser(obs: Observation, optimiser: str, momentum: float) -> Observation:
    """``obs`` whose recipe trains with ``optimiser`` (and SGD's ``momentum``)."""
    return dataclasses.replace(obs, client=dataclasses.replace(recipe(obs), optimiser=optimiser, momentum=momentum))


def candidate_name(optimiser: str, momentum: float) -> str:
    return f"SGD β {momentum:g}" if optimiser == "sgd" else {"adam": "Adam", "adamw": "AdamW"}.get(optimiser, optimiser)


def estimate(obs: Observation, aux: Auxiliary, seed: int = 0) -> LabelEstimate:
    """Per-class counts of a multi-step FedAvg update (see the module docstring), and how well the recipe's
    simulation reproduces the update's head change (:class:`RecipeFit`). Where the recipe's source leaves the
    optimiser or SGD's momentum open, each candidate of :func:`candidate_recipes` runs the passes and the one whose
    simulated head change is closest in norm to the observed one is searched. ``obs.update`` holds the sent
    weights; the recipe's lr must be known (the scale of the right-hand side)."""
    client = recipe(obs)
    total = client.examples
    rows = head_rows(obs)
    trials = {}
    for optimiser, beta in candidate_recipes(obs):
        tried = with_optimiser(obs, optimiser, beta)
        systems = Systems(tried, aux)
        if (found := passes(tried, aux, rows, beta, 0.0, seed, systems)) is not None:
            trials[optimiser, beta] = (tried, systems, found)
    if not trials:
        raise ValueError("the simulated local training diverged under every recipe tried")
    moved = update_norm(obs)
    fits = {key: recipe_fit(sim, rows, moved, candidate_name(*key)) for key, (_, _, (_, sim)) in trials.items()}
    key = min(fits, key=lambda k: fits[k].mismatch)  # a recipe that fits before any that does not
    obs, systems, (passed, _) = trials[key]
    optimiser, chosen = key
    note = f"local training simulated on {aux.source} ({client.steps} steps of {client.batch}, lr {client.lr:g}"
    how = ""
    if len(trials) > 1:
        how = "after the passes, " + ", ".join(f.brief() for f in fits.values())
        note += f"); {candidate_name(*key)} inferred from the update ({how})"
    elif optimiser in ADAM_FAMILY:
        note += f", {optimiser} with torch's default betas)"
    else:
        note += f", momentum {chosen:g})"
    starts = {"the passes' estimate": passed, "the sent model's class shares": learned_mix(obs, aux)}
    searched = {name: residual_search(obs, aux, rows, start, chosen, 0.0, seed, SEARCH_STEPS, systems)
                for name, start in starts.items()}  # fmt: skip
    best = lowest_residual(searched)
    counts = searched[best].counts
    note += (f"; class-mix search: residual {searched[best].residual:.2f} from {best} (" + ", ".join(
        f"{f.residual:.2f} from {name}" for name, f in searched.items() if name != best) + "), " +
        f"{sum(f.simulations for f in searched.values())} residuals")  # fmt: skip
    changed = lambda other: int(np.abs(other - counts).sum() // 2)  # noqa: E731 — images that change class
    alternatives = {
        b: residual_search(tried, aux, rows, start, b, 0.0, seed, SIDE_SEARCH_STEPS, side).counts
        for (name, b), (tried, side, (start, _)) in trials.items()
        if name == "sgd" and optimiser == "sgd" and b != chosen
    }
    for b, other in alternatives.items():
        note += f"; under momentum {b:g} {changed(other)} of {total} images change class"
    if obs.config is None and optimiser == "sgd":
        decayed = residual_search(obs, aux, rows, counts, chosen, WEIGHT_DECAY, seed, SIDE_SEARCH_STEPS, systems)
        note += f"; under weight decay {WEIGHT_DECAY:g} {changed(decayed.counts)} change class"
    # the same recipe on another draw of auxiliary images and another shuffle: how far two runs of it differ
    # the direction rests on the estimated counts, which rest on SGD's relation: checked under SGD only
    other = systems(counts, chosen, seed + OTHER_DRAW, 0.0) if optimiser == "sgd" else None
    fit = recipe_fit(systems(counts, chosen, seed, 0.0), rows, moved, candidate_name(*key), other) if (
        optimiser in SIMULATED_OPTIMISERS) else None  # another optimiser: SGD's steps ran in its place, not it
    runs = systems.runs + sum(s.runs for _, s, _ in trials.values() if s is not systems)
    note += f"; {runs} simulations run in all (a repeated one looked up)"
    return LabelEstimate(counts, chosen, note, alternatives, how, optimiser, fit)


# How far a recipe's simulated head change may sit from the observed one and still be said to fit: its norm within
# a factor SCALE_MARGIN either way, and its direction within cosine COSINE_MARGIN. The simulation trains on
# auxiliary images, not the client's, so even the right recipe misses by some; the margins are set from controls
# (the right recipe against a wrong optimiser, a 10x learning rate, a wrong momentum, a missing augmentation) on
# the CNN and the ViT head: `uv run python -m benchmarks.recipe_fit` (docs/results/data/recipe-fit.csv).
SCALE_MARGIN = 2.0
COSINE_SPREAD, COSINE_FLOOR = 3.0, 0.02
FLATNESS_MARGIN = 0.12
OTHER_DRAW = 7919  # seed offset of the second simulation (another draw of auxiliary images and shuffle)


@dataclasses.dataclass(frozen=True)
class RecipeFit:
    """How well simulating the recipe reproduces the update, at the estimated class counts: the norm of the whole
    trained update (``scale``: simulated / observed; a 10× lr moves the body's layers about 10× as far, while the
    head's change saturates), the head change's direction (``cosine``) and how evenly its entries moved
    (:func:`flatness`: Adam's signature)."""

    recipe: str
    scale: float
    cosine: float
    flatness: tuple[float, float] = (math.nan, math.nan)  # mean |Δ| / RMS Δ, simulated and observed
    own_cosine: float = math.nan  # cosine between two simulations of the recipe on other draws (NaN: not run)

    @property
    def cosine_bound(self) -> float:
        """The lowest cosine that fits: the update may differ from the simulation COSINE_SPREAD times as much as
        two simulations of the recipe differ from each other, and COSINE_FLOOR more (−1 where not checked: the
        direction depends on the estimated counts, which rest on SGD's relation; under Adam they do not hold)."""
        if math.isnan(self.own_cosine):
            return -1.0
        return 1 - COSINE_SPREAD * (1 - self.own_cosine) - COSINE_FLOOR

    @property
    def mismatch(self) -> float:
        """How far the simulation is from the update, in margins (≤ 1 on each measure where it fits), a recipe
        that fits always below one that does not (NaN: infinite)."""
        parts = [abs(math.log(max(self.scale, 1e-12))) / math.log(SCALE_MARGIN),
                 (1 - self.cosine) / max(1 - self.cosine_bound, 1e-12),
                 abs(self.flatness[0] - self.flatness[1]) / FLATNESS_MARGIN]  # fmt: skip
        return math.inf if any(math.isnan(p) for p in parts) else max(parts) + (0 if self.fits else 1e6)

    def brief(self) -> str:
        return (f"{self.recipe}: norm ×{self.scale:.2f}, cosine {self.cosine:.2f}, flatness {self.flatness[0]:.2f}/"
                f"{self.flatness[1]:.2f}{'' if self.fits else ' (does not fit)'}")

    @property
    def fits(self) -> bool:
        return (abs(math.log(max(self.scale, 1e-12))) <= math.log(SCALE_MARGIN) and self.cosine >= self.cosine_bound
                and abs(self.flatness[0] - self.flatness[1]) <= FLATNESS_MARGIN)  # fmt: skip

    def described(self) -> str:
        verdict = "fits" if self.fits else "does not fit"
        direction = (f"cosine {self.cosine:.3f} (two simulations of it: {self.own_cosine:.3f}; fits from "
                     f"{self.cosine_bound:.3f})" if not math.isnan(self.own_cosine) else
                     f"cosine {self.cosine:.2f} (not checked: it rests on the counts, which rest on SGD's relation)")
        return (f"{self.recipe} {verdict} the update at the estimated class counts: simulated/observed update norm "
                f"×{self.scale:.2f} (fits within ×{SCALE_MARGIN:g} either way), {direction}, flatness "
                f"{self.flatness[0]:.2f}/{self.flatness[1]:.2f} (fits within {FLATNESS_MARGIN:g})")  # fmt: skip


def recipe_fit(simulation: Simulation, rows: np.ndarray, moved: float, name: str, other: Simulation | None = None
               ) -> RecipeFit:  # fmt: skip
    """The fit of one simulation to the observed update: its norm over every trained parameter against ``moved``
    (the update's), its head change against ``rows`` (:func:`head_rows`); ``other``: the same recipe simulated on
    another draw (the direction's spread between two runs of the right recipe)."""
    simulated = simulation.head_delta
    if simulated is None or not np.isfinite(simulated).all() or moved == 0 or not np.isfinite(simulation.update_norm):
        return RecipeFit(name, math.nan, math.nan)
    own = math.nan
    if other is not None and other.head_delta is not None and np.isfinite(other.head_delta).all():
        own = cosine_of(simulated, other.head_delta)
    return RecipeFit(name, simulation.update_norm / moved, cosine_of(simulated, rows),
                     (flatness(simulated), flatness(rows)), own)  # fmt: skip


def cosine_of(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b) / max(float(np.linalg.norm(a) * np.linalg.norm(b)), 1e-300)


def flatness(change: np.ndarray) -> float:
    """mean |Δ| / RMS Δ over the entries: near 1 where every entry moved by about as much (Adam's first steps move
    each by about lr per step, whatever its gradient), lower where a few entries carry the change (SGD's steps are
    proportional to the gradient)."""
    rms = float(np.sqrt(np.mean(np.square(change))))
    return float(np.mean(np.abs(change))) / rms if rms > 0 else math.nan


@torch.no_grad()
def learned_mix(obs: Observation, aux: Auxiliary) -> np.ndarray:
    """N × the sent model's mean softmax on the auxiliary images, over their class shares: the class prior the
    client's training taught the model, a start for the search that the passes, stalled near the uniform mix, do
    not give. ``obs.update`` holds the sent weights (a multi-step reply)."""
    model = model_with(obs, obs.update).float().eval()
    classes = len(obs.update[obs.head_bias])
    shares = np.zeros(classes)
    for first in range(0, len(aux.images), 256):
        x = torch.as_tensor(aux.images[first : first + 256], dtype=torch.float32)
        shares += torch.softmax(classify(model, x).double(), 1).sum(0).numpy()[:classes]
    shares = shares / max(shares.sum(), 1e-12) / np.maximum(aux.prior(classes), 1e-3)
    return recipe(obs).examples * shares / shares.sum()


class Systems:
    """The system S(n) of :func:`simulate` at integer counts n, under a momentum, weight decay and shuffling seed,
    for one update: a simulation is deterministic in these, and the searches from both starts often meet (then
    visit the same counts), so a repeat is looked up rather than run again; ``runs``: the simulations run."""

    def __init__(self, obs: Observation, aux: Auxiliary) -> None:
        self.obs, self.aux, self.runs = obs, aux, 0
        self.found: dict[tuple, Simulation] = {}

    def __call__(self, counts: np.ndarray, momentum: float, seed: int, weight_decay: float) -> Simulation:
        key = (tuple(int(c) for c in counts), momentum, seed, weight_decay)
        if key not in self.found:
            self.runs += 1
            self.found[key] = simulate(self.obs, self.aux, counts, momentum, seed, weight_decay)
        return self.found[key]


def passes(obs: Observation, aux: Auxiliary, rows: np.ndarray, momentum: float, weight_decay: float,
           seed: int, systems: Systems | None = None) -> tuple[np.ndarray, Simulation] | None:  # fmt: skip
    """The counts after :data:`PASSES` simulations under one momentum and weight decay (the first from a uniform
    class mix, each later one from the previous estimate) and the last simulation; None where the simulated
    training diverged."""
    client = recipe(obs)
    total = client.examples
    classes = len(obs.update[obs.head_bias])
    rhs = scaled_rhs(obs, rows, momentum)
    counts = np.full(classes, total // classes) + (np.arange(classes) < total % classes)
    systems = systems or Systems(obs, aux)
    for k in range(PASSES):
        sim = systems(counts, momentum, seed + k, weight_decay)
        if not np.isfinite(sim.system).all():
            return None
        counts = integer_counts(solve_counts(sim.system, rhs, total), total)
    return counts, sim


@dataclasses.dataclass(frozen=True)
class SearchResult:
    """The counts a class-mix search ended at, their relative residual ‖S(n) n − rhs‖ / ‖rhs‖ and the simulations
    it ran."""

    counts: np.ndarray
    residual: float
    simulations: int


def lowest_residual(searched: dict[str, SearchResult]) -> str:
    """The name of the search that ended at the lowest residual (a diverged one, NaN, never)."""
    return min(searched, key=lambda name: np.nan_to_num(searched[name].residual, nan=np.inf))


def residual_search(obs: Observation, aux: Auxiliary, rows: np.ndarray, start: np.ndarray, momentum: float,
                    weight_decay: float, seed: int, steps: int, systems: Systems | None = None
                    ) -> SearchResult:  # fmt: skip
    """Gauss–Newton from ``start`` on r(n) = (S(n) n − rhs) / ‖rhs‖: the Jacobian by finite differences (move
    :data:`FD_SHARE` of the images into one class, keeping Σn = N), the linearised least squares solved with n ≥ 0
    and Σn = N, and 1, 2 or 4 times that step kept where r falls; it ends when no step lowers r, a step moves
    fewer than :data:`CONVERGED` of the images, or after ``steps`` steps. A simulation that diverges ends it at
    the best counts so far. ``simulations`` counts the residuals evaluated (``systems`` may hold some already)."""
    systems = systems or Systems(obs, aux)
    total = int(recipe(obs).examples)
    rhs = scaled_rhs(obs, rows, momentum)
    scale = max(float(np.linalg.norm(rhs)), 1e-12)
    simulations = 0

    def residual(n: np.ndarray) -> np.ndarray | None:
        nonlocal simulations
        simulations += 1
        system = systems(integer_counts(n, total), momentum, seed, weight_decay).system
        return (system @ n - rhs) / scale if np.isfinite(system).all() else None

    n = np.asarray(start, np.float64)
    r = residual(n)
    if r is None:
        return SearchResult(integer_counts(n, total), math.nan, simulations)
    classes, h = len(n), FD_SHARE * total
    for _ in range(steps):
        jacobian = np.empty((len(r), classes))
        for k in range(classes):
            d = -n / total * h
            d[k] += h
            moved = residual(n + d)
            if moved is None:
                return SearchResult(integer_counts(n, total), float(np.linalg.norm(r)), simulations)
            jacobian[:, k] = (moved - r) / h
        step = solve_counts(jacobian, jacobian @ n - r, total) - n
        best = (float(np.linalg.norm(r)), n, r)
        for length in (1.0, 2.0, 4.0):
            m = n + length * step
            if (m < 0).any():
                break
            if (r_new := residual(m)) is not None and np.linalg.norm(r_new) < best[0]:
                best = (float(np.linalg.norm(r_new)), m, r_new)
        if best[1] is n:
            break
        moved_images = float(np.abs(best[1] - n).sum()) / 2
        n, r = best[1], best[2]
        if moved_images < CONVERGED * total:
            break
    return SearchResult(integer_counts(n, total), float(np.linalg.norm(r)), simulations)


def prior_accuracy(prior: np.ndarray, true_labels: np.ndarray) -> float:
    """The label accuracy of the null: N × the prior's class shares (real counts), against the truth."""
    true_counts = np.bincount(np.asarray(true_labels, np.int64), minlength=len(prior))[: len(prior)]
    return float(np.minimum(len(true_labels) * prior, true_counts).sum() / max(len(true_labels), 1))


def benchmarked_error(obs: Observation) -> str:
    """The error this method had in fedvit's benchmark for this model family at the nearest number of epochs (none
    for a client whose optimiser the benchmark did not use)."""
    if obs.trained is not None:
        return "none: fedvit's benchmark trains whole models, not a head on a frozen backbone"
    family = "vit" if hasattr(received_model(obs), "patch_embed") else "cnn"
    optimiser = recipe(obs).optimiser or "sgd"
    if optimiser in ADAM_FAMILY and family in ADAM_ERROR:
        table, what = ADAM_ERROR[family], f"{family}, Adam"
    elif (why := not_plain_sgd(obs)) is not None:
        return f"none: {why}"
    else:
        table, what = BENCHMARKED_ERROR[family], family
    epochs = min(table, key=lambda e: abs(e - recipe(obs).epochs))
    return f"{table[epochs]:.0%} of images misplaced in fedvit's benchmark ({what}, {epochs} local epoch(s))"
