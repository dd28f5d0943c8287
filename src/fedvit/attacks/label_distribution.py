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
import functools
import math
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

import numpy as np
import torch
from scipy.optimize import nnls

from fedvit.attacks.holdings import Auxiliary
from fedvit.attacks.simulation import OTHER_DRAW, RecipeFit, Simulation, head_weight, recipe_fit, simulate, step_weights
from fedvit.core.model import classify
from fedvit.observed.augmentation import Augmentation
from fedvit.observed.observation import (
    Observation,
    model_with,
    not_plain_sgd,
    received_model,
    recipe,
    update_norm,
)
from fedvit.observed.recipe import ADAM_FAMILY, SIMULATED_OPTIMISERS

MOMENTA = (0.0, 0.9)  # the values tried when no record carries the momentum (plain SGD; the common default)
PASSES = 3  # simulations per momentum: a uniform class mix, then each estimate sets the next one's
SEARCH_STEPS = 5  # Gauss–Newton steps at most (each: one simulation per class, then up to 3 for the step length)
SIDE_SEARCH_STEPS = 1  # for the counts under the other momentum and under weight decay (their sensitivity)
FD_SHARE = 0.05  # finite-difference step of the Jacobian: this share of the client's images moved into one class
CONVERGED = 0.005  # a step that moves fewer than this share of the images ends the search
WEIGHT_DECAY = 5e-4  # the common value, tried beside 0 for another app's update (no record carries it)
SUM_WEIGHT = 10.0  # weight of the Σn = N row against the C rows of the least squares
FROM_PASSES, FROM_LEARNED = "the passes' estimate", "the sent model's class shares"  # the class-mix search's starts
# Label-count error (1 − label accuracy) of this method in fedvit's own benchmark, by model family and local
# epochs: the worst over IID and five Dirichlet(0.5) draws and 1,000 or 2,000 images per client, B = 32, lr 0.01,
# momentum 0.9 on no record, and over two draws of the attack's own simulations (its run-to-run spread moved single
# clients by up to 24 points). Measured 2026-12-06 (commit ed1673e) with
# `uv run python -m benchmarks.label_distribution --workers 2` (docs/results/data/label-distribution.csv) and
# 2026-12-07 with `--attack-draw 1` (label-distribution-spread.csv, benchmarks/label_spread.py);
# tests/test_label_distribution.py checks that they agree. The prior misplaces 27-47% on those skewed clients.
BENCHMARKED_ERROR = {"cnn": {1: 0.04, 3: 0.10, 5: 0.32}, "vit": {1: 0.13, 3: 0.16, 5: 0.17}}
# The same for an Adam client (lr 0.001, torch's defaults; on record), whose update this method's SGD relation does
# not describe: the worst over IID and two Dirichlet(0.5) draws, 1,000 images, B = 32 — worse than the prior's on
# the skewed clients after 1 epoch. `uv run python -m benchmarks.adam_vs_sgd --workers 2` (adam-vs-sgd.csv)
ADAM_ERROR = {"cnn": {1: 0.49, 3: 0.33}}


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
    augment: Augmentation | None = None  # the augmentation the simulation ran (the declared one, or none)
    simulations: int = 0  # the simulated local trainings run in all (a repeated one looked up, not counted)


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


class Candidate(NamedTuple):
    """One recipe the label estimate's simulation tries: an optimiser, SGD's momentum and the augmentation."""

    optimiser: str
    momentum: float
    augment: Augmentation | None = None


def candidate_recipes(obs: Observation) -> list[Candidate]:
    """The recipes the simulation tries: the recipe's own where its source states the optimiser and momentum;
    every momentum of :data:`MOMENTA` where only SGD is stated; SGD at each momentum, Adam and AdamW where nothing
    states the optimiser (Adam's steps are near lr per coordinate whatever the gradient's scale, SGD's scale with
    it: the head change they simulate tells them apart), each with and without the declared augmentation, if any."""
    client = recipe(obs)
    if client.optimiser is None:
        views = (client.augment, None) if client.augment is not None else (None,)
        return [Candidate(name, beta, view) for view in views
                for name, beta in [("sgd", beta) for beta in MOMENTA] + [(name, 0.0) for name in ADAM_FAMILY]]
    if client.optimiser == "sgd" and not client.momentum_known:
        return [Candidate("sgd", beta, client.augment) for beta in MOMENTA]
    return [Candidate(client.optimiser, client.momentum, client.augment)]


def with_optimiser(obs: Observation, candidate: Candidate) -> Observation:
    """``obs`` whose recipe trains as ``candidate`` says."""
    client = dataclasses.replace(recipe(obs), optimiser=candidate.optimiser, momentum=candidate.momentum,
                                 augment=candidate.augment)  # fmt: skip
    return dataclasses.replace(obs, client=client)


def candidate_name(candidate: Candidate, declared: Augmentation | None = None) -> str:
    """How the report names a candidate (``declared``: the augmentation the recipe states, if any)."""
    optimiser, momentum = candidate.optimiser, candidate.momentum
    name = f"SGD β {momentum:g}" if optimiser == "sgd" else {"adam": "Adam", "adamw": "AdamW"}.get(optimiser, optimiser)
    return name + (", no augmentation" if declared is not None and candidate.augment is None else "")


def estimate(obs: Observation, aux: Auxiliary, seed: int = 0, search_steps: int | None = None) -> LabelEstimate:
    """Per-class counts of a multi-step FedAvg update (see the module docstring), and how well the recipe's
    simulation reproduces the update (:class:`RecipeFit`). Where the recipe's source leaves the optimiser or SGD's
    momentum open, each candidate of :func:`candidate_recipes` runs the passes and the one that fits the update best
    (:attr:`RecipeFit.mismatch`) is searched. ``obs.update`` holds the sent weights; the recipe's lr must be known
    (the scale of the right-hand side). ``search_steps``: the class-mix search's Gauss–Newton steps at most per start
    (None: :data:`SEARCH_STEPS`; fewer trade error for time, benchmarks/label_distribution.py --search-steps)."""
    client = recipe(obs)
    total = client.examples
    rows = head_rows(obs)
    trials = {}
    def tried(candidate: Candidate) -> tuple[Observation, Systems, tuple | None]:
        trained = with_optimiser(obs, candidate)
        systems = Systems(trained, aux)
        return trained, systems, passes(trained, aux, rows, candidate.momentum, 0.0, seed, systems)

    candidates = candidate_recipes(obs)
    for candidate, (trained, systems, found) in zip(candidates, side_by_side(tried, candidates), strict=True):
        if found is not None:
            trials[candidate] = (trained, systems, found)
    if not trials:
        raise ValueError("the simulated local training diverged under every recipe tried")
    moved = update_norm(obs)
    named = {key: candidate_name(key, client.augment) for key in trials}
    fits = {key: recipe_fit(sim, rows, moved, named[key]) for key, (_, _, (_, sim)) in trials.items()}
    key = min(fits, key=lambda k: fits[k].mismatch)  # a recipe that fits before any that does not
    obs, systems, (passed, _) = trials[key]
    optimiser, chosen = key.optimiser, key.momentum
    note = f"local training simulated on {aux.source} ({client.steps} steps of {client.batch}, lr {client.lr:g}"
    how = ""
    if len(trials) > 1:
        how = "after the passes, " + ", ".join(f.brief() for f in fits.values())
        note += f"); {named[key]} inferred from the update ({how})"
    elif optimiser in ADAM_FAMILY:
        note += f", {optimiser} with torch's default betas)"
    else:
        note += f", momentum {chosen:g})"
    searched = class_mix_search(obs, aux, rows, passed, chosen, seed, systems,
                                SEARCH_STEPS if search_steps is None else search_steps)  # fmt: skip
    best = lowest_residual(searched)
    counts = searched[best].counts
    if searched[best].settled:
        note += (f"; class-mix search: none, {FROM_PASSES} is self-consistent to within the simulation's "
                 f"draw-to-draw spread (residual {searched[best].residual:.2f}, spread {searched[best].spread:.2f})")
    else:
        others = ", ".join(f"{f.residual:.2f} from {name}" for name, f in searched.items() if name != best)
        note += (f"; class-mix search: residual {searched[best].residual:.2f} from {best} ({others}), "
                 f"{sum(f.simulations for f in searched.values())} residuals")  # fmt: skip
    changed = lambda other: int(np.abs(other - counts).sum() // 2)  # noqa: E731 — images that change class
    near = searched[best].jacobian  # the side searches' one step starts from the search's last Jacobian
    alternatives = {
        b: residual_search(tried, aux, rows, start, b, 0.0, seed, SIDE_SEARCH_STEPS, side, near).counts
        for (name, b, view), (tried, side, (start, _)) in trials.items()
        if name == "sgd" and optimiser == "sgd" and b != chosen and view == key.augment
    }
    for b, other in alternatives.items():
        note += f"; under momentum {b:g} {changed(other)} of {total} images change class"
    # the sensitivity to weight decay, unless the code or the run config states none (the simulations run without it)
    if optimiser == "sgd" and not client.source_of("weight decay").startswith("0 ("):
        decayed = residual_search(obs, aux, rows, counts, chosen, WEIGHT_DECAY, seed, SIDE_SEARCH_STEPS, systems, near)
        note += f"; under weight decay {WEIGHT_DECAY:g} {changed(decayed.counts)} change class"
    # the same recipe on another draw of auxiliary images and another shuffle: how far two runs of it differ
    # the direction rests on the estimated counts, which rest on SGD's relation: checked under SGD only
    other = systems(counts, chosen, seed + OTHER_DRAW, 0.0) if optimiser == "sgd" else None
    fit = (
        recipe_fit(systems(counts, chosen, seed, 0.0), rows, moved, named[key], other)
        if (optimiser in SIMULATED_OPTIMISERS)
        else None
    )  # another optimiser: SGD's steps ran in its place, not it
    runs = systems.runs + sum(s.runs for _, s, _ in trials.values() if s is not systems)
    note += f"; {runs} simulations run in all (a repeated one looked up)"
    return LabelEstimate(counts, chosen, note, alternatives, how, optimiser, fit, key.augment, runs)


def class_mix_search(obs: Observation, aux: Auxiliary, rows: np.ndarray, passed: np.ndarray, momentum: float,
                     seed: int, systems: Systems | None = None, steps: int = SEARCH_STEPS
                     ) -> dict[str, SearchResult]:  # fmt: skip
    """The residual searches by start: none where the passes' estimate is already self-consistent to within the
    simulation's draw-to-draw spread (``floor`` of :func:`residual_search`), else from it and from the sent model's
    class shares (:func:`learned_mix`). The rule is measured, not derived (benchmarks/label_mix_search.py, fifteen
    skewed CNN clients): after one local epoch the passes misplace as few images as a simulation at the true counts
    and mostly end within the spread; after three or five they misplace 16–42%, never end within it, and the search
    from both starts is what brings them to 1–6%, its residual still ranking counts below the spread. ``steps``:
    Gauss–Newton steps at most per start."""
    if steps < 0:
        raise ValueError(f"the class-mix search's steps must be >= 0, got {steps}")
    search = functools.partial(residual_search, obs, aux, rows, momentum=momentum, weight_decay=0.0, seed=seed,
                               steps=steps, systems=systems)  # fmt: skip
    searched = {FROM_PASSES: search(start=passed, floor=True)}
    if not searched[FROM_PASSES].settled:
        searched[FROM_LEARNED] = search(start=learned_mix(obs, aux))
    return searched


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
        self._counting = threading.Lock()  # side_by_side runs two at a time
        self.found: dict[tuple, Simulation] = {}

    def __call__(self, counts: np.ndarray, momentum: float, seed: int, weight_decay: float) -> Simulation:
        key = (tuple(int(c) for c in counts), momentum, seed, weight_decay)
        if key not in self.found:
            with self._counting:
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
    jacobian: np.ndarray | None = None  # the last Jacobian of r (None: the search ended before one)
    spread: float | None = None  # ‖r(n) − r'(n)‖ at the start, r' under another draw (None: not measured)
    settled: bool = False  # the start's residual was within that spread: no step was taken


def lowest_residual(searched: dict[str, SearchResult]) -> str:
    """The name of the search that ended at the lowest residual (a diverged one, NaN, never)."""
    return min(searched, key=lambda name: np.nan_to_num(searched[name].residual, nan=np.inf))


def residual_search(obs: Observation, aux: Auxiliary, rows: np.ndarray, start: np.ndarray, momentum: float,
                    weight_decay: float, seed: int, steps: int, systems: Systems | None = None,
                    jacobian: np.ndarray | None = None, floor: bool = False) -> SearchResult:  # fmt: skip
    """Gauss–Newton from ``start`` on r(n) = (S(n) n − rhs) / ‖rhs‖: the Jacobian by finite differences (move
    :data:`FD_SHARE` of the images into one class, keeping Σn = N), the linearised least squares solved with n ≥ 0
    and Σn = N, and 1, 2 or 4 times that step kept where r falls; it ends when no step lowers r, a step moves
    fewer than :data:`CONVERGED` of the images, or after ``steps`` steps. ``jacobian``: the first step's Jacobian
    (a nearby search's last, for a one-step sensitivity line) instead of differencing one. A simulation that
    diverges ends it at the best counts so far. ``floor``: r is also evaluated at the start under another draw of
    auxiliary images and shuffle (seed + :data:`OTHER_DRAW`), and no step is taken where ‖r‖ is no larger than
    ‖r − r'‖ there (the start is self-consistent to within the simulation's own draw). Only the start is held to
    it: once the search moves, the residual under one fixed draw keeps ranking the counts below that spread (see
    :func:`class_mix_search`). ``simulations`` counts the residuals evaluated (``systems`` may hold some already)."""
    systems = systems or Systems(obs, aux)
    total = int(recipe(obs).examples)
    rhs = scaled_rhs(obs, rows, momentum)
    scale = max(float(np.linalg.norm(rhs)), 1e-12)

    def residual(n: np.ndarray, draw: int = seed) -> np.ndarray | None:
        system = systems(integer_counts(n, total), momentum, draw, weight_decay).system
        return (system @ n - rhs) / scale if np.isfinite(system).all() else None

    n = np.asarray(start, np.float64)
    r, simulations = residual(n), 1
    if r is None:
        return SearchResult(integer_counts(n, total), math.nan, simulations)
    spread = None
    if floor and (other := residual(n, seed + OTHER_DRAW)) is not None:
        spread, simulations = float(np.linalg.norm(r - other)), simulations + 1
        if np.linalg.norm(r) <= spread:
            return SearchResult(integer_counts(n, total), float(np.linalg.norm(r)), simulations, None, spread, True)
    classes, h = len(n), FD_SHARE * total
    last = None
    for _ in range(steps):
        if jacobian is None:
            displaced = [n + h * (np.eye(classes)[k] - n / total) for k in range(classes)]
            moved = side_by_side(residual, displaced)
            simulations += classes
            if any(m is None for m in moved):
                return SearchResult(integer_counts(n, total), float(np.linalg.norm(r)), simulations, None, spread)
            jacobian = np.stack([(m - r) / h for m in moved], axis=1)
        step = solve_counts(jacobian, jacobian @ n - r, total) - n
        last, jacobian = jacobian, None
        best = (float(np.linalg.norm(r)), n, r)
        lengths = [n + length * step for length in (1.0, 2.0, 4.0)]  # n + L·step only falls below 0 as L grows
        lengths = lengths[: next((k for k, m in enumerate(lengths) if (m < 0).any()), len(lengths))]
        simulations += len(lengths)
        for m, r_new in zip(lengths, side_by_side(residual, lengths), strict=True):
            if r_new is not None and np.linalg.norm(r_new) < best[0]:
                best = (float(np.linalg.norm(r_new)), m, r_new)
        if best[1] is n:
            break
        moved_images = float(np.abs(best[1] - n).sum()) / 2
        n, r = best[1], best[2]
        if moved_images < CONVERGED * total:
            break
    return SearchResult(integer_counts(n, total), float(np.linalg.norm(r)), simulations, last, spread)


def side_by_side(function: Callable[[Any], Any], points: list[Any]) -> list[Any]:
    """``function`` at every point, two at a time on one torch thread each. The candidate recipes' passes, and the
    search's simulations at the finite differences and at the step lengths, are independent, and each simulation is
    deterministic in its own seeds: the results are those of running them one by one on one thread, 1.2–1.3× sooner
    on 2 cores (small models leave torch's intra-op threads idle between kernels)."""
    threads = torch.get_num_threads()
    if threads < 2 or len(points) < 2:
        return [function(p) for p in points]
    torch.set_num_threads(1)
    try:
        with ThreadPoolExecutor(max_workers=2) as pool:
            return list(pool.map(function, points))
    finally:
        torch.set_num_threads(threads)


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
