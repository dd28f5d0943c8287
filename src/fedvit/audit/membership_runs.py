"""Membership judged on runs the audit sets up itself, where membership is known or one score stands alone: the
power twin (:func:`simulated_power`, :func:`aggregate_power`: an update like the captured one simulated with known
members and judged as the real one is, by the loss scores) and one score judged alone (:func:`infer`)."""

from __future__ import annotations

import dataclasses

import numpy as np

from fedvit.attacks.holdings import Auxiliary, Candidates
from fedvit.attacks.membership import (
    alignment_score,
    candidate_losses,
    loss_drop_score,
    loss_scores,
)
from fedvit.attacks.reidentification import evenly_spaced
from fedvit.attacks.simulation import Simulation, simulate
from fedvit.audit.membership_stats import Judgement, judge
from fedvit.observed.observation import Observation


def simulated_power(
    obs: Observation, pool: Auxiliary, counts: np.ndarray, momentum: float, seed: int, non_members: int
) -> Judgement:  # fmt: skip
    """Membership in an update like this one where membership is known: the client's local training simulated from
    the received weights with its recipe, ``momentum`` and the estimated class ``counts`` on images drawn from
    ``pool`` (the label estimate's simulation), then judged as the real update is, by the loss scores
    (:data:`~fedvit.attacks.membership.LOSS_SCORES`), with the drawn images as members and up to ``non_members``
    other pool images (as many as the real split scores: the same resolution) as non-members. What the audit could
    detect in such an update."""
    simulation = simulate(obs, pool, counts, momentum, seed, keep_weights=True, private=True)
    trained = np.unique(simulation.drawn[simulation.drawn >= 0])
    rest = np.setdiff1d(np.arange(len(pool.images)), trained)
    rest = rest[evenly_spaced(len(rest), non_members)] if len(rest) > non_members else rest
    candidates = Candidates((pool.images[trained], pool.labels[trained]), (pool.images[rest], pool.labels[rest]),
                            f"{len(rest)} other images of {pool.source}")  # fmt: skip
    simulated_update = dataclasses.replace(obs, update=simulation.weights)
    found, _, _ = judge(loss_scores(candidate_losses(simulated_update, candidates)), candidates, seed)
    return found


def aggregate_power(
    obs: Observation, pool: Auxiliary, counts: np.ndarray, momentum: float, seed: int, non_members: int, members: int
) -> tuple[Judgement, Judgement]:  # fmt: skip
    """:func:`simulated_power` for a SecAgg+ aggregate of ``members`` FedAvg clients: each member's local training
    simulated from the received weights with ``obs``'s recipe (one member's) on its own share of ``pool``,
    ``counts`` split evenly among them; their weights averaged by their sizes, as FedAvg does; then judged by the
    loss scores on the union of the drawn images, and on the first member's alone, against up to ``non_members``
    pool images no member drew. What the audit could detect of the union, and of one client, at this N."""
    split = member_counts(counts, members)
    owner = np.zeros(len(pool.labels), dtype=np.int64)  # each member draws from its own share of the pool: within
    for k in np.unique(pool.labels):  # each class every members-th image, so no image trains two members
        owner[pool.labels == k] = np.arange(int(np.sum(pool.labels == k))) % members
    own = [np.flatnonzero(owner == m) for m in range(members)]
    runs = [simulate(obs, dataclasses.replace(pool, images=pool.images[own[m]], labels=pool.labels[own[m]]), share,
                     momentum, seed + m, keep_weights=True, private=True) for m, share in enumerate(split)]  # fmt: skip
    sizes = split.sum(1).astype(np.float64)
    average = {k: sum(w * r.weights[k].astype(np.float64) for w, r in zip(sizes / sizes.sum(), runs, strict=True))
               .astype(runs[0].weights[k].dtype) for k in runs[0].weights}  # fmt: skip
    drawn = [own[m][np.unique(r.drawn[r.drawn >= 0])] for m, r in enumerate(runs)]
    union = np.unique(np.concatenate(drawn))
    rest = np.setdiff1d(np.arange(len(pool.images)), union)
    rest = rest[evenly_spaced(len(rest), non_members)] if len(rest) > non_members else rest
    outside = (pool.images[rest], pool.labels[rest])
    source = f"{len(rest)} other images of {pool.source}"
    simulated_update = dataclasses.replace(obs, update=average)
    found = []
    for inside in (union, drawn[0]):
        candidates = Candidates((pool.images[inside], pool.labels[inside]), outside, source)
        found.append(judge(loss_scores(candidate_losses(simulated_update, candidates)), candidates, seed)[0])
    return found[0], found[1]


def member_counts(counts: np.ndarray, members: int) -> np.ndarray:
    """``counts`` per class split among ``members`` as evenly as integers allow ([members, classes]; each class's
    remainder to the first members)."""
    counts = np.asarray(counts, dtype=np.int64)
    return counts[None, :] // members + (np.arange(members)[:, None] < counts[None, :] % members)


def infer(
    obs: Observation, candidates: Candidates, seed: int = 0,
    shadows: list[Simulation] | None = None, pool: Auxiliary | None = None,
) -> tuple[Judgement, np.ndarray, np.ndarray]:  # fmt: skip
    """One score judged alone (:func:`~fedvit.audit.membership_stats.judge`):
    :func:`~fedvit.attacks.membership.alignment_score` against ``shadows``
    (:func:`~fedvit.attacks.membership.reference_updates`) trained on ``pool``, images that are none of the candidates
    (:func:`~fedvit.attacks.membership.split_for_references`), else
    :func:`~fedvit.attacks.membership.loss_drop_score`."""
    if shadows and pool is None:
        raise ValueError("shadow updates need the pool they were trained on (split_for_references)")
    if shadows:
        return judge([alignment_score(obs, candidates, shadows, pool)], candidates, seed)
    return judge([loss_drop_score(candidate_losses(obs, candidates))], candidates, seed)
