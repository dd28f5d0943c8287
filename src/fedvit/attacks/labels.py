"""Label recovery from the classifier head's bias gradient: counts per class, duplicates included.

For mean-reduced cross-entropy over a batch of B images the head-bias gradient is
g_c = (1/B) Σ_i (p_ic − y_ic) (softmax p, one-hot y), so the number of images of class c is
n_c = B·p̄_c − B·g_c with p̄_c the batch-mean softmax (the idea of iDLG, Zhao et al. 2020, extended to batches
as in Wainakh et al.'s LLG). The attacker does not see p̄; it estimates it from the received model's softmax on
uninformative inputs, or, where that fits the gradient worse, as equal shares among the classes whose bias
gradient is negative (:func:`best_counts`). A FedAvg update over E local steps holds −lr·Σ_t g_t in its bias:
the same formula gives the label counts of all E·B samples the client processed as long as the softmax does not
move; for several local steps see :mod:`fedvit.attacks.label_distribution`.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np
import torch
from torch import nn

from fedvit.attacks.holdings import Auxiliary
from fedvit.attacks.label_distribution import estimate, integer_counts, noise_auxiliary
from fedvit.attacks.simulation import RecipeFit
from fedvit.core.model import classify
from fedvit.observed.observation import (
    Observation,
    as_gradient,
    attack_model,
    attacker_seed,
    input_shape,
    received_model,
    recipe,
    simulated,
    update_clipped,
)
from fedvit.observed.recipe import ClientRecipe


def label_counts(head_bias_grad: np.ndarray, batch_size: int, mean_probs: np.ndarray) -> np.ndarray:
    """Integer counts per class, summing to ``batch_size``: B·p̄ − B·g rounded by largest remainders, with at
    least one image of every class whose bias gradient is negative (g_c < 0 needs y_c > p_c for some image)."""
    g = np.asarray(head_bias_grad, np.float64)
    raw = np.clip(batch_size * (np.asarray(mean_probs, np.float64) - g), 0.0, None)
    floor = (g < 0).astype(np.int64)
    if floor.sum() > batch_size:  # more negative entries than images (noise): the most negative B
        counts = np.zeros(len(g), np.int64)
        counts[np.argsort(g, kind="stable")[:batch_size]] = 1
        return counts
    counts = np.maximum(np.floor(raw).astype(np.int64), floor)
    while counts.sum() > batch_size:  # take from the count furthest above its raw value (never below the floor)
        excess = np.where(counts > floor, counts - raw, -np.inf)
        counts[int(np.argmax(excess))] -= 1
    if counts.sum() < batch_size:
        missing = batch_size - int(counts.sum())
        counts[np.argsort(-(raw - counts), kind="stable")[:missing]] += 1
    return counts


def equal_share_softmax(head_bias_grad: np.ndarray) -> np.ndarray:
    """A p̄ estimate from the gradient alone: exact (p̄_c = g_c) for classes taken as absent (g_c ≥ 0), and the
    remaining probability mass shared equally among the classes with g_c < 0 (the idea behind breaching's
    "bias-corrected" rule; a trained model's softmax on noise says little about its softmax on real images)."""
    g = np.asarray(head_bias_grad, np.float64)
    present = g < 0
    if not present.any():
        return np.clip(g, 0, None)
    return np.where(present, (1.0 - g[~present].sum()) / present.sum(), g)


def _integrality(head_bias_grad: np.ndarray, batch_size: int, mean_probs: np.ndarray) -> float:
    """How far B·(p̄ − g) lies from non-negative integers (squared distance): small when p̄ is right."""
    raw = np.clip(batch_size * (np.asarray(mean_probs, np.float64) - np.asarray(head_bias_grad, np.float64)), 0, None)
    return float(((raw - np.round(raw)) ** 2).sum())


def best_counts(head_bias_grad: np.ndarray, batch_size: int, noise_probs: np.ndarray) -> tuple[np.ndarray, str]:
    """:func:`label_counts` with whichever p̄ estimate, the model's softmax on noise or the equal share, makes the
    raw counts closer to integers (measured in docs/results/benchmarks.md: the noise estimate fails on trained models,
    the equal share on large batches of a random model)."""
    share = equal_share_softmax(head_bias_grad)
    if _integrality(head_bias_grad, batch_size, share) < _integrality(head_bias_grad, batch_size, noise_probs):
        return label_counts(head_bias_grad, batch_size, share), "p̄ as equal shares"
    return label_counts(head_bias_grad, batch_size, noise_probs), ""


def label_counts_unknown_scale(scaled_grad: np.ndarray, batch_size: int, mean_probs: np.ndarray) -> np.ndarray:
    """:func:`label_counts` when the update was scaled by an unknown factor s ∈ (0, 1] (DP clipping): the s whose
    raw counts B·(p̄ − g/s) lie closest to non-negative integers (a log grid of 200 values)."""
    best_s, best_cost = 1.0, np.inf
    for s in np.geomspace(1e-4, 1.0, 200):
        raw = batch_size * (np.asarray(mean_probs, np.float64) - np.asarray(scaled_grad, np.float64) / s)
        cost = float(((raw - np.clip(np.round(raw), 0, None)) ** 2).sum())
        if cost < best_cost:
            best_s, best_cost = float(s), cost
    return label_counts(np.asarray(scaled_grad, np.float64) / best_s, batch_size, mean_probs)


@torch.no_grad()
def mean_softmax(model: nn.Module, input_shape: tuple[int, int, int], samples: int = 64, seed: int = 0) -> np.ndarray:
    """p̄ as the attacker estimates it: the model's mean softmax on uniform-noise images [C, H, W] in [0, 1]."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.rand(samples, *input_shape, generator=generator)
    return torch.softmax(classify(model.eval(), x), dim=1).mean(0).double().numpy()


def label_accuracy(counts: np.ndarray, true_labels: np.ndarray) -> float:
    """Fraction of the true labels the recovered counts account for (a multiset match, duplicates included)."""
    true_counts = np.bincount(np.asarray(true_labels, np.int64), minlength=len(counts))
    return float(np.minimum(counts, true_counts[: len(counts)]).sum() / max(len(true_labels), 1))


class Recovered(NamedTuple):
    """Label counts (None: not recovered, ``note`` says why), the momentum a simulation used (None: none ran) and,
    where no record carried the momentum, how it was estimated from the update ("" otherwise)."""

    counts: np.ndarray | None
    note: str
    momentum: float | None = None
    momentum_estimate: str = ""
    optimiser: str | None = None  # the optimiser the simulation ran (None: none ran)
    fit: RecipeFit | None = None  # how well the simulated recipe reproduces the update (None: nothing simulated)
    without_augment: bool = False  # the declared augmentation fit worse than none: the simulation ran without it


def recover_labels_and_momentum(obs: Observation, aux: Auxiliary | None = None) -> Recovered:
    """The label counts an eavesdropper recovers from one observed update, or None and the reason it cannot, and the
    momentum its simulation used (None where it simulated nothing).

    Needs the classifier bias sent whole (not masked; the encryption key only touches the embeddings) and the
    client's recipe (:func:`fedvit.observed.observation.recipe`). FedSGD and single-step FedAvg: g is the gradient (for
    FedAvg Δb / lr), counted as above. Several local steps: the softmax moved while the client trained, so the
    counts of its N images come from a simulation of its local training on ``aux`` (auxiliary images, none of the
    client's; uniform noise without them): :func:`~fedvit.attacks.label_distribution.estimate`.
    Where the scale is unknown
    (DP clipping, an lr no record carries) a single step's is estimated (:func:`label_counts_unknown_scale`); a
    multi-step update's is not.
    """
    bias = obs.head_bias
    if bias not in obs.update:
        return Recovered(None, "no final linear layer with a bias")
    if obs.masks is not None and not obs.masks[bias].all():
        return Recovered(None, "the mask hides part of the head-bias gradient")
    if (why := simulated(obs)) is not None:
        return Recovered(None, why)
    client = recipe(obs)
    dp = obs.defence.dp
    member = member_recipe(obs)
    if member.several_steps:
        if not client.lr_known:
            return Recovered(None, "not estimated: no record carries the learning rate (give --recipe lr=...)")
        if dp:
            return Recovered(None, "not estimated: DP clipping scaled the update by an unknown factor")
        aux = aux or noise_auxiliary(input_shape(obs), obs.num_classes, attacker_seed(obs))
        found = estimate(dataclasses.replace(obs, client=member), aux, attacker_seed(obs))
        counts, note = found.counts, found.note
        if member is not client:  # one member's share of the aggregate, scaled to all of its images
            counts = integer_counts(counts * client.examples / member.examples, client.examples)
            note = (f"a SecAgg+ aggregate of {len(obs.meta['member-examples'])} clients simulated as one client of "
                    f"{member.examples} images ({member.steps} steps), its counts scaled to the {client.examples}; "
                    + note)  # fmt: skip
        dropped = client.augment is not None and found.augment is None
        return Recovered(counts, note, found.momentum, found.momentum_estimate, found.optimiser, found.fit,
                         dropped)  # fmt: skip
    # Flower's client-side clipping scaled this update by an unknown factor: as DP clipping, the scale is estimated
    dp = dp or update_clipped(obs)
    # another app's model on batch statistics, as its client trained it (BatchNorm); fedvit's ViT as received
    model = received_model(obs) if obs.defence.fedvit else attack_model(obs)
    mean_probs = mean_softmax(model, input_shape(obs), seed=attacker_seed(obs))
    if client.sends_gradient:
        grad, examples = obs.update[bias], client.batch
    elif not client.lr_known:  # Δb = lr · ḡ with lr unknown: the scale that makes the counts integral
        delta = as_gradient(obs).update[bias]
        return Recovered(label_counts_unknown_scale(delta, client.examples, mean_probs), "lr unknown: scale estimated")
    else:
        grad = as_gradient(obs).update[bias] / client.lr
        if obs.correction is not None:  # SCAFFOLD moved the step by c − c_i as well
            grad = grad - obs.correction[bias]
        examples = client.examples
    if dp:  # clipping scaled the update by an unknown factor
        return Recovered(label_counts_unknown_scale(grad, examples, mean_probs), "clip scale estimated")
    return Recovered(*best_counts(grad, examples, mean_probs))


def member_recipe(obs: Observation) -> ClientRecipe:
    """The recipe whose local training the label counts rest on: the client's own, or for a SecAgg+ aggregate of
    FedAvg updates (``member-examples`` in its meta) one member's, with the members' mean number of images.

    Every member starts from the same broadcast model, so where each takes one local step the aggregate's head
    change is lr times the mean of (softmax − one-hot) over all their images: one step over the union, counted
    exactly. Where they take several, the mean of N trainings is simulated as one training on 1/N of the union (exact
    where the members' class mixes agree; the recipe-fit check says where they do not)."""
    client = recipe(obs)
    members = obs.meta.get("member-examples") or {}
    if len(members) < 2 or client.sends_gradient:
        return client
    return dataclasses.replace(client, examples=max(1, round(sum(members.values()) / len(members))))


def recover_labels(obs: Observation, aux: Auxiliary | None = None) -> tuple[np.ndarray | None, str]:
    """:func:`recover_labels_and_momentum` without the momentum."""
    found = recover_labels_and_momentum(obs, aux)
    return found.counts, found.note
