"""The statistics of membership inference, whatever the score: each score's ROC figures at the false-positive rates
its calibrated scores resolve, with Clopper–Pearson intervals (Carlini et al., "Membership Inference Attacks From
First Principles", S&P 2022, arXiv 2112.03570); the null of within-class label shuffles over the whole family of
scores (Westfall and Young's max-T), the judgement against it (:func:`judge`), scores combined over a client's
rounds, and the empirical lower bound on ε that the membership test proves (:func:`privacy_bound`). The scores
themselves are the attacks' (:mod:`fedvit.attacks.membership`, :class:`~fedvit.attacks.scores.Score`); judging them
against the members and non-members is the audit's, here."""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterator
from typing import NamedTuple

import numpy as np
from scipy.special import ndtri

from fedvit.attacks.holdings import Candidates
from fedvit.attacks.scores import Score, evenly
from fedvit.audit.json_fields import from_keys, keyed, named

FPRS = (0.001, 0.01)
CONFIDENCE = 0.95  # Clopper–Pearson intervals on the TPR and the FPR reached
NULL_DRAWS = 1000  # within-class label shuffles behind the null
NULL_QUANTILE = 0.999  # a finding must beat this quantile of the null (per figure and update)
FIT_MINIMUM = 20  # non-members of a class a Gaussian fit of their scores needs (LiRA's offline test)
PARAMETRIC = "tpr@0.001-parametric"  # TPR at 0.1% FPR of the per-class Gaussian fit
NULL_BATCH = 2_000_000  # draws × candidates judged at once by the null (each array of the batch: 16 MB)
EPSILON_NULL_DRAWS = 200  # within-class shuffles behind the empirical ε's null (each one a full bound: ~12 ms)


@dataclasses.dataclass(frozen=True)
class RocFigures:
    """A score's ROC figures (:func:`roc_figures`), or a null's thresholds for them (:func:`null_figures`): AUC, TPR
    at each of :data:`FPRS` (None below the FPR resolution) and at the resolution itself, and the TPR at 0.1% FPR of
    the per-class Gaussian fit (None without one)."""

    auc: float
    tpr_at_0_1_percent: float | None = named("tpr@0.001")
    tpr_at_1_percent: float | None = named("tpr@0.01")
    tpr_at_resolution: float | None = named("tpr@resolution")
    parametric: float | None = named(PARAMETRIC)

    def tpr(self, target: str) -> float | None:
        """The TPR at ``target``: "0.001", "0.01" or "resolution"."""
        return self.named()[f"tpr@{target}"]

    @property
    def judged_at(self) -> str:
        """The target a TPR is judged at: 1% FPR where resolved, else the resolution."""
        return "0.01" if self.tpr_at_1_percent is not None else "resolution"

    def named(self) -> dict[str, float | None]:
        """The figures under their statistical names ("auc", "tpr@0.01", ...)."""
        return keyed(self)


@dataclasses.dataclass(frozen=True)
class OperatingPoint:
    """At one FPR target: the FPR the ROC reaches there, and 95% Clopper–Pearson intervals of the TPR (of the members)
    and of that FPR (of the non-members); below the resolution, only the non-members per class it needs."""

    needs: int | None = None
    fpr: float | None = None
    tpr_ci: list[float] | None = None
    fpr_ci: list[float] | None = None


@dataclasses.dataclass(frozen=True)
class FitCheck:
    """The per-class Gaussian fit against the empirical CDF (:func:`fit_check`)."""

    target: float
    found: float  # the share of non-members the fit's ``target`` threshold passes
    ci: list[float]
    agrees: bool  # the interval holds ``target``


@dataclasses.dataclass(frozen=True, kw_only=True)
class ScoreJudgement(RocFigures):
    """One score of the family: its figures, its null within the family and whether it clears it."""

    null: RocFigures
    clears_null: bool
    per_class: bool


@dataclasses.dataclass(frozen=True, kw_only=True)
class Judgement(RocFigures):
    """One update's (or one client's rounds') membership judged (:func:`judge`): the strongest score's figures, its
    intervals and null, and every score of the family beside it."""

    members: int
    non_members: int
    non_member_source: str
    score: str  # the strongest score's name
    reference: str
    operating_points: dict[str, OperatingPoint]  # per target ("0.001", "0.01", "resolution")
    null: RocFigures
    clears_null: bool
    fpr_resolution: float  # after calibration: 1 / the fewest non-members of a member's class
    non_members_per_class: int
    members_needed: int  # :func:`members_needed`
    scores: dict[str, ScoreJudgement]
    fit_check: FitCheck | None = None


@dataclasses.dataclass(frozen=True)
class EpsilonBound:
    """The lower bound on ε a membership test proves (:func:`empirical_epsilon`) and where it was found."""

    epsilon_lower: float
    delta: float
    confidence: float
    thresholds: int  # the thresholds it was taken over (its Bonferroni split)
    at: dict[str, float] | None  # the TPR and FPR of the threshold that gave it


@dataclasses.dataclass(frozen=True, kw_only=True)
class PrivacyBound(EpsilonBound):
    """:func:`privacy_bound`: the bound on the family's raw values, and its null over within-class shuffles."""

    null: float
    null_draws: int
    members: int
    non_members: int
    scores: list[str]


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
    classes, members = one_split(member_labels, non_member_labels)
    ranks = null_calibrated(np.concatenate([member_scores, non_member_scores]), classes, members)[0]
    return ranks[: len(member_scores)], ranks[len(member_scores) :]


def one_split(member_labels: np.ndarray, non_member_labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The pooled candidates' classes and the real split as the null's one draw ([1, N] member marks, members
    first)."""
    classes = np.concatenate([member_labels, non_member_labels]).astype(np.int64)
    return classes, np.arange(len(classes))[None] < len(member_labels)


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


class Roc(NamedTuple):
    """The strongest score's judged values on the members and non-members, their classes (a null band's within-class
    shuffles keep them) and the FPR resolution (below it the curve says nothing): what the report's ROC draws."""

    members: np.ndarray
    non_members: np.ndarray
    member_classes: np.ndarray
    non_member_classes: np.ndarray
    resolution: float


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


def roc_figures(member_scores: np.ndarray, non_member_scores: np.ndarray, resolution: float = 0.0) -> RocFigures:
    """ROC AUC, TPR at each of :data:`FPRS` that ``resolution`` (:func:`fpr_resolution`) allows (None below it)
    and TPR at the resolution itself (members positive, a higher score meaning member)."""
    fpr, tpr, auc = split_roc(member_scores, non_member_scores)
    figures: dict[str, float | None] = {"auc": auc}
    for f in FPRS:
        figures[f"tpr@{f:g}"] = operating_point(fpr, tpr, f)[0] if resolved(f, resolution) else None
    return from_keys(RocFigures, figures | {"tpr@resolution": operating_point(fpr, tpr, max(resolution, 0.0))[0]})


def intervals(member_scores: np.ndarray, non_member_scores: np.ndarray, resolution: float
              ) -> dict[str, OperatingPoint]:  # fmt: skip
    """Per FPR target ("0.001", "0.01", "resolution") its :class:`OperatingPoint`: where resolved, the FPR actually
    reached and 95% Clopper–Pearson intervals on the TPR (of the members) and on that FPR (of the non-members);
    below the resolution, the non-members per class it needs."""
    fpr, tpr, _ = split_roc(member_scores, non_member_scores)
    out: dict[str, OperatingPoint] = {}
    for name, target in [*((f"{f:g}", f) for f in FPRS), ("resolution", resolution)]:
        if not resolved(target, resolution):
            out[name] = OperatingPoint(needs=needs(target))
            continue
        rate, reached = operating_point(fpr, tpr, target)
        out[name] = OperatingPoint(
            None, reached, clopper_pearson(round(rate * len(member_scores)), len(member_scores)),
            clopper_pearson(round(reached * len(non_member_scores)), len(non_member_scores)))  # fmt: skip
    return out


def clopper_pearson(successes: int, trials: int, confidence: float = CONFIDENCE) -> list[float]:
    """The exact (Clopper–Pearson) interval of a binomial proportion."""
    from scipy.stats import binomtest

    if trials == 0:
        return [0.0, 1.0]
    found = binomtest(int(successes), int(trials)).proportion_ci(confidence, method="exact")
    return [float(found.low), float(found.high)]


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


def judged(score: Score | RoundsScore, member_labels: np.ndarray, non_member_labels: np.ndarray
           ) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """The values a score's figures are read from: calibrated per class (:func:`calibrate`), or raw; a combined
    score's Stouffer sum of its parts' ranks."""
    if isinstance(score, RoundsScore):
        values = null_judged(score, *one_split(member_labels, non_member_labels))[0]
        return values[: len(member_labels)], values[len(member_labels) :]
    if not score.per_class:
        return score.members, score.non_members
    return calibrate(score.members, score.non_members, member_labels, non_member_labels)


def fitted(score: Score | RoundsScore, member_labels: np.ndarray, non_member_labels: np.ndarray
           ) -> tuple[np.ndarray, np.ndarray] | None:  # fmt: skip
    """Both sides' values as z-scores under a Gaussian fitted to the non-members of their class (LiRA's offline
    test, Carlini et al., arXiv 2112.03570): a calibration that reaches below one over the class's non-members.
    None for a score judged raw, a combined score (a combination of ranks has no per-class Gaussian), or where a
    member's class has fewer than :data:`FIT_MINIMUM` non-members."""
    if isinstance(score, RoundsScore) or not score.per_class:
        return None
    classes = int(max(member_labels.max(initial=0), non_member_labels.max(initial=0))) + 1
    count = np.bincount(non_member_labels, minlength=classes).astype(float)
    if (count[np.unique(member_labels)] < FIT_MINIMUM).any():
        return None
    mean = np.bincount(non_member_labels, score.non_members, classes) / np.maximum(count, 1)
    spread = np.bincount(non_member_labels, (score.non_members - mean[non_member_labels]) ** 2, classes)
    spread = np.sqrt(spread / np.maximum(count - 1, 1)) + 1e-12
    return ((score.members - mean[member_labels]) / spread[member_labels],
            (score.non_members - mean[non_member_labels]) / spread[non_member_labels])  # fmt: skip


def resplit(score: Score | RoundsScore, is_member: np.ndarray) -> Score | RoundsScore:
    """The same values on another member/non-member split of the pooled candidates (a null's shuffle)."""
    if isinstance(score, RoundsScore):
        return dataclasses.replace(score, parts=tuple(resplit(p, is_member) for p in score.parts))
    pooled = np.concatenate([score.members, score.non_members])
    return dataclasses.replace(score, members=pooled[is_member], non_members=pooled[~is_member])


def score_figures(
    score: Score | RoundsScore, member_labels: np.ndarray, non_member_labels: np.ndarray, resolution: float
) -> RocFigures:  # fmt: skip
    """:func:`roc_figures` of the score's judged values, and the TPR at 0.1% FPR of its Gaussian fit
    (:func:`fitted`; None without one)."""
    found = roc_figures(*judged(score, member_labels, non_member_labels), resolution)
    fit = fitted(score, member_labels, non_member_labels)
    return dataclasses.replace(found, parametric=None if fit is None else float(np.mean(fit[0] > ndtri(1 - FPRS[0]))))


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
) -> list[RocFigures]:  # fmt: skip
    """Per score, the null of each figure across :data:`NULL_DRAWS` shuffles of the member/non-member labels within
    each class, every score judged on each draw as on the real split (calibrated on the draw's own non-members
    where it is calibrated). Several scores are one family (Westfall and Young's max-T): each figure is
    standardised by its score's own draws (mean, spread), the family's threshold is the :data:`NULL_QUANTILE` of the
    largest standardised figure across the scores in each draw, and each score's null is that threshold in its own
    units, so choosing the strongest of k scores does not inflate the evidence and no score's null is set by
    another's (one score alone: the plain quantile). The class composition of the two sides stays, so a score that
    only tells the client's frequent classes from the population's (its label distribution, a noised model's class
    bias, the raw loss of a class-skewed client) is in its null, not counted as membership. The shuffles keep each
    class's non-member count: the null has the real split's resolution (None where a target is below it). The draws
    are judged in batches (:func:`null_roc_figures`): per draw, the figures :func:`score_figures` gives (tested)."""
    classes, real = one_split(member_labels, non_member_labels)
    resolution, _ = fpr_resolution(member_labels, non_member_labels)
    shuffles = within_class_shuffles(real[0], classes, NULL_DRAWS, seed)
    batches: list[dict[str, list[np.ndarray | None]]] = [{} for _ in scores]  # [score][figure] -> per batch
    while batch := list(itertools.islice(shuffles, max(1, NULL_BATCH // max(len(classes), 1)))):
        members = np.stack(batch)
        for k, score in enumerate(scores):
            figures = null_roc_figures(null_judged(score, classes, members), members, resolution)
            figures[PARAMETRIC] = null_parametric(score, classes, members)
            for name, values in figures.items():
                batches[k].setdefault(name, []).append(values)
    draws = [{name: None if parts[0] is None else np.concatenate(parts) for name, parts in b.items()} for b in batches]
    nulls: list[dict[str, float | None]] = [dict.fromkeys(draws[0]) for _ in scores]
    for figure in draws[0]:  # a figure a score lacks (below the resolution, no fit) is None in every draw
        present = [k for k in range(len(scores)) if draws[k][figure] is not None]
        if not present:
            continue
        found = np.stack([draws[k][figure] for k in present], axis=1)  # [draws, scores]
        if len(present) == 1:
            nulls[present[0]][figure] = float(np.quantile(found[:, 0], NULL_QUANTILE))
            continue
        centre, spread = found.mean(0), np.maximum(found.std(0), 1e-12)
        threshold = np.quantile(((found - centre) / spread).max(1), NULL_QUANTILE)
        for j, k in enumerate(present):
            nulls[k][figure] = float(centre[j] + threshold * spread[j])
    return [from_keys(RocFigures, null) for null in nulls]


def null_mid_ranks(values: np.ndarray, reference: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """[draws, N]: in each draw, each value's mid-rank among the values that draw marks as ``reference`` ([draws, N]
    bool) within its group (:func:`class_ranks`'s (#{r < s} + ½ #{r = s}) / n, the group's n being the same in every
    draw, as within-class shuffles keep it). One sort per group for all draws: the counts below and through each
    value are cumulative sums of the marks along the group's sorted values."""
    ranks = np.empty(reference.shape)
    for group in np.unique(groups):
        order = np.flatnonzero(groups == group)
        order = order[np.argsort(values[order])]  # any order within a tie: only run ends are read
        ordered = values[order]
        starts = np.r_[0, np.flatnonzero(np.diff(ordered)) + 1]  # each run of tied values
        sizes = np.diff(np.r_[starts, len(ordered)])
        first, last = np.repeat(starts, sizes), np.repeat(starts + sizes, sizes)
        counts = np.zeros((len(reference), len(ordered) + 1), np.int32)
        np.cumsum(reference[:, order], axis=1, out=counts[:, 1:])
        below, through = counts[:, first], counts[:, last]
        ranks[:, order] = (below + 0.5 * (through - below)) / np.maximum(counts[:, -1:], 1)
    return ranks


def null_calibrated(values: np.ndarray, classes: np.ndarray, members: np.ndarray) -> np.ndarray:
    """:func:`calibrate` of the pooled ``values`` on every draw's split (``members`` [draws, N]) at once: each value's
    mid-rank among its class's non-members of the draw; a class with fewer than two non-members among all of them."""
    non_members = ~members
    ranks = null_mid_ranks(values, non_members, classes)
    per_class = np.bincount(classes, non_members[0], minlength=classes.max(initial=0) + 1)
    few = per_class[classes] < 2
    if few.any():
        ranks[:, few] = null_mid_ranks(values, non_members, np.zeros(len(values), np.int64))[:, few]
    return ranks


def null_judged(score: Score | RoundsScore, classes: np.ndarray, members: np.ndarray) -> np.ndarray:
    """The values :func:`judged` gives on each draw's split, [draws, N] over the pooled candidates (members first, as
    :func:`resplit` pools them); [N] for a raw score, the same in
    every draw."""
    if isinstance(score, Score):
        pooled = np.concatenate([score.members, score.non_members])
        if not score.per_class:
            return pooled
        return null_calibrated(pooled, classes, members)
    floor = 0.5 / max(int((~members[0]).sum()), 1)
    total = np.zeros(members.shape)
    for part in score.parts:
        pooled = np.concatenate([part.members, part.non_members])
        if part.per_class:
            ranks = null_calibrated(pooled, classes, members)
        else:
            ranks = null_mid_ranks(pooled, ~members, np.zeros(len(pooled), np.int64))
        total += ndtri(np.clip(ranks, floor, 1 - floor))
    return total / math.sqrt(len(score.parts))


def null_roc_figures(values: np.ndarray, members: np.ndarray, resolution: float) -> dict[str, np.ndarray | None]:
    """:func:`roc_figures` of every draw at once (``members``: [draws, N]; ``values``: [draws, N], or [N] where
    every draw ranks alike: one sort), from one ascending sort per row. The AUC is the Mann–Whitney U with ties
    counted half: U = Σ_members mid-rank − m(m + 1)/2, a value's mid-rank being the middle of its run of tied values
    (exact in half-integers). The ROC's points are the last image of each run in descending order (the first of the
    run in ascending order); a TPR at an FPR target is the last point's within it (the TPR never falls). Only the
    first m + ⌊t·n⌋ + 1 images in descending order can hold a point with at most t·n false positives (t the largest
    target read), so only they are walked."""
    draws, n = members.shape
    inside = int(members[0].sum())
    outside = n - inside
    if values.ndim == 1:
        order = np.argsort(values)
        ordered, hits = values[order][None], members[:, order]
    else:
        order = np.argsort(values, axis=1)
        ordered, hits = np.sort(values, axis=1), np.take_along_axis(members, order, 1)
    starts = np.ones(ordered.shape, bool)  # the first position of each run of tied values
    starts[:, 1:] = ordered[:, 1:] != ordered[:, :-1]
    runs = np.flatnonzero(starts)  # over the flattened rows: every row starts a run, none crosses a row's end
    sizes = np.diff(np.r_[runs, starts.size])
    # 2 × each position's 1-based mid-rank: a run from position a (0-based) of L tied values has a + (L + 1)/2
    twice_ranks = np.repeat(2 * (runs % n) + sizes + 1, sizes).reshape(ordered.shape)
    summed = hits @ twice_ranks[0] if len(ordered) == 1 else (hits * twice_ranks).sum(1)
    auc = (summed - inside * (inside + 1)) / (2 * max(inside, 1) * max(outside, 1))
    targets = [max(resolution, 0.0), *(f for f in FPRS if resolved(f, resolution))]
    length = min(n, inside + math.floor((max(targets) + 1e-12) * max(outside, 1)) + 1)
    true_positives = np.cumsum(hits[:, ::-1][:, :length], axis=1)  # descending from here
    tpr = true_positives / max(inside, 1)
    fpr = (np.arange(1, length + 1) - true_positives) / max(outside, 1)
    point = np.broadcast_to(starts[:, ::-1][:, :length], (draws, length))

    def tpr_at(target: float) -> np.ndarray:
        return np.where(point & (fpr <= target + 1e-12), tpr, 0.0).max(1)

    figures: dict[str, np.ndarray | None] = {"auc": auc}
    for f in FPRS:
        figures[f"tpr@{f:g}"] = tpr_at(f) if resolved(f, resolution) else None
    return figures | {"tpr@resolution": tpr_at(max(resolution, 0.0))}


def null_parametric(score: Score | RoundsScore, classes: np.ndarray, members: np.ndarray) -> np.ndarray | None:
    """:func:`fitted`'s TPR at 0.1% FPR on every draw's split at once (None where the score has no fit: a raw
    or combined score, or a member class with fewer than :data:`FIT_MINIMUM` non-members, the same in every draw)."""
    if not isinstance(score, Score) or not score.per_class:
        return None
    count = np.bincount(classes[~members[0]], minlength=classes.max(initial=0) + 1).astype(float)
    if (count[np.unique(classes[members[0]])] < FIT_MINIMUM).any():
        return None
    pooled = np.concatenate([score.members, score.non_members])
    one_hot = (classes[:, None] == np.arange(len(count))).astype(float)
    outside = (~members).astype(float)
    mean = (outside * pooled) @ one_hot / np.maximum(count, 1)
    centred = pooled - mean[:, classes]
    spread = np.sqrt((outside * centred**2) @ one_hot / np.maximum(count - 1, 1)) + 1e-12
    passed = (centred / spread[:, classes] > ndtri(1 - FPRS[0])) & members
    return passed.sum(1) / max(int(members[0].sum()), 1)


def members_needed(member_labels: np.ndarray, non_member_labels: np.ndarray, scores: int = 1) -> int:
    """About how many members (in the same class shares, beside the same non-members) a null needs before a figure
    can clear it: a within-class shuffle puts every member of class c on top of its n_c non-members with probability
    1 / C(n_c + m_c, m_c), so the null's top quantile stays at AUC 1 (and TPR 100%) until the product over the classes
    falls below 1 − :data:`NULL_QUANTILE` (divided over the family's ``scores``, whose maximum the null takes). A
    lower bound: the family's standardised maximum asks for more."""
    classes, shares = np.unique(member_labels, return_counts=True)
    outside = {int(c): int(np.sum(non_member_labels == c)) for c in classes}
    limit = math.log((1 - NULL_QUANTILE) / max(scores, 1))
    total = len(member_labels)
    while total < 100 * len(member_labels) + 10_000:
        counts = np.maximum(np.round(shares * total / len(member_labels)).astype(int), 1)
        log_p = -sum(math.log(math.comb(outside[int(c)] + int(m), int(m))) for c, m in zip(classes, counts,
                                                                                        strict=True))  # fmt: skip
        if log_p < limit:
            return int(counts.sum())
        total += 1
    return total


def clears_null(figures: RocFigures, null: RocFigures) -> bool:
    """A finding: AUC beyond its null, and TPR beyond its null at 1% FPR where resolved, else at the resolution."""
    at = figures.judged_at
    return figures.auc > null.auc and figures.tpr(at) > null.tpr(at)


def judge(
    scores: list[Score] | list[RoundsScore], candidates: Candidates, seed: int = 0
) -> tuple[Judgement, np.ndarray, np.ndarray]:  # fmt: skip
    """Membership figures of one update from its strongest score against that score's null within the family
    (:func:`null_figures`): the score with the highest AUC among those that clear their null, else the highest AUC
    of all; every score's figures and null beside it. Returns them and the strongest score's judged values on the
    members and non-members (``scores`` were taken on ``candidates``, at most :data:`MAX_CANDIDATES` per side)."""
    member_labels, non_member_labels = evenly(*candidates.members)[1], evenly(*candidates.non_members)[1]
    resolution, fewest = fpr_resolution(member_labels, non_member_labels)
    values = [judged(s, member_labels, non_member_labels) for s in scores]
    each = [score_figures(s, member_labels, non_member_labels, resolution) for s in scores]
    nulls = null_figures(scores, member_labels, non_member_labels, seed)
    cleared = [clears_null(f, n) for f, n in zip(each, nulls, strict=True)]
    best = max(range(len(scores)), key=lambda k: (cleared[k], each[k].auc))
    inside, outside = values[best]
    fit = fitted(scores[best], member_labels, non_member_labels)
    result = Judgement(
        **dataclasses.asdict(each[best]),
        members=len(inside),
        non_members=len(outside),
        non_member_source=candidates.source,
        score=scores[best].name,
        reference=scores[best].reference,
        operating_points=intervals(inside, outside, resolution),
        null=nulls[best],
        clears_null=cleared[best],
        fpr_resolution=resolution,
        non_members_per_class=fewest,
        members_needed=members_needed(member_labels, non_member_labels, len(scores)),
        scores={s.name: ScoreJudgement(**dataclasses.asdict(f), null=n, clears_null=c, per_class=s.per_class)
                for s, f, n, c in zip(scores, each, nulls, cleared, strict=True)},  # fmt: skip
        fit_check=None if fit is None else fit_check(fit[1]),
    )
    return result, inside, outside


def fit_check(non_members: np.ndarray, target: float = FPRS[1]) -> FitCheck:
    """The per-class Gaussian fit against the empirical CDF where both apply: the share of non-members its ``target``
    FPR threshold passes, with its Clopper–Pearson interval; the fit agrees when the interval holds ``target``."""
    passed = int(np.sum(non_members > ndtri(1 - target)))
    low, high = clopper_pearson(passed, len(non_members))
    return FitCheck(target, passed / max(len(non_members), 1), [low, high], bool(low <= target <= high))


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
) -> PrivacyBound:  # fmt: skip
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
        null = max(null, drawn.epsilon_lower)
    return PrivacyBound(**dataclasses.asdict(found), null=null, null_draws=draws, members=len(inside),
                        non_members=len(outside), scores=[s.name for s in family])  # fmt: skip


def empirical_epsilon(judged: list[tuple[np.ndarray, np.ndarray]], delta: float,
                      confidence: float = CONFIDENCE) -> EpsilonBound:  # fmt: skip
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
    return EpsilonBound(best, delta, confidence, tests, at)
