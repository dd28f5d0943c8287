"""What the audit may conclude: per update and leakage type (label distribution, membership, images) the figure,
the same figure on a null that holds no information, the margin a finding must clear, and from these the verdict.

Nulls: label counts against the prior (N × the population's class shares: a guess without the update); membership
figures against the member/non-member labels shuffled within each class (:mod:`fedvit.attacks.membership`);
re-identification against the same reconstructions matched to and ranked among images the update never saw
(:func:`fedvit.audit.metrics.null_reid`).
"LEAKS" needs a figure beyond its null by the margin; a figure nothing could check is "unverified".
Threat models as Carletti et al. name them ("SoK: Gradient Inversion Attacks in Federated Learning", USENIX
Security 2025).
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

import numpy as np

from fedvit.audit.json_fields import flattened
from fedvit.audit.membership_stats import Judgement, PrivacyBound, RocFigures, clopper_pearson

if TYPE_CHECKING:
    from fedvit.audit.metrics import ImageScores
    from fedvit.observed.recipe import PrivacyClaim

LABELS = "labels (head-bias gradient)"  # the label estimate's name as an attack (report rows, the frontier)
LABEL_MARGIN = 0.05  # the counts must misplace ≥ 5 points of the images fewer than the prior does
IMAGE_MARGIN = 0.05  # re-identification top-1 above the null's by ≥ 5 points ...
REID_SIGNIFICANCE = 0.01  # ... and beyond what the null's rate reaches by chance with probability 1%
MEASURED, UNVERIFIED, NOT_MEASURED = "measured", "estimated (unverified)", "not measured"
LEAKAGE_KINDS = ("labels", "membership", "images")  # the leakage types, in the report's order (--leakage picks)
THREAT_MODELS = {
    "server": "honest-but-curious server: every client's reply and the instruction it was sent",
    "wire-tap": "passive eavesdropper on the wire: both directions of every train exchange",
}
CLIENT_LINK = "eavesdropper on the client's link: both directions of its train exchanges"


TLS_ONLY = ("passive eavesdropper on the wire, every link TLS: connection metadata only (peers, times, bytes), no "
            "message and no app bundle; the server, which ends the TLS, still sees every update: to audit its view, "
            "capture it with CapturingStrategy around the strategy (from fedvit import CapturingStrategy) or "
            "capture_mod on the ClientApp, and give --app DIR|FAB for the recipe")  # fmt: skip


def threat_model(observers: list[str | None], assumed: bool, tls_links: int = 0) -> str:
    """The threat model the captures stand for, and how much of the recipe it knows (``tls_links``: connections a
    wire tap could not read; with no readable exchange at all, that is the whole threat model)."""
    if not observers and tls_links:
        return f"{TLS_ONLY} ({tls_links} TLS or HTTP/2 link(s) in tap.json)"
    seen = "; ".join(dict.fromkeys(THREAT_MODELS.get(o or "", CLIENT_LINK) for o in observers)) or CLIENT_LINK
    knows = (
        "parameter-aware: reads the recipe from the app's code, the records and the update, assumes the rest (listed "
        "per update)"
        if assumed
        else "parameter-aware: every recipe value from the app's code, the records or the update"
    )
    return f"{seen}; {knows} (Carletti et al., SoK, USENIX Security 2025)"


# ---------------------------------------------------------------------------- the one rule per leakage type


def labels_clear(error: float, null: float, images: int) -> bool:
    """Label counts leak: they misplace at least :data:`LABEL_MARGIN` of the images fewer than the prior does, and
    the 95% Clopper–Pearson interval of their error over ``images`` lies below the prior's error."""
    if null - error < LABEL_MARGIN:
        return False
    return clopper_pearson(round(error * images), images)[1] < null


def label_images_needed(null: float, most: int = 100_000) -> int | None:
    """The fewest images at which exactly right counts would clear a prior that misplaces ``null`` of them
    (:func:`labels_clear` at error 0); None where none would (the prior is within the margin of exact)."""
    if null < LABEL_MARGIN:
        return None
    # Clopper–Pearson's upper bound at 0 of n is 1 − (α/2)^(1/n): below ``null`` from n > ln(α/2) / ln(1 − null)
    n = max(1, math.ceil(math.log((1 - 0.95) / 2) / math.log1p(-min(null, 1 - 1e-12))))
    while n < most and not labels_clear(0.0, null, n):
        n += 1
    while n > 1 and labels_clear(0.0, null, n - 1):
        n -= 1
    return n


def images_clear(top1: float, null: float | None, chance: float | None, images: int) -> bool:
    """Images leak: the reconstructions re-identify their true images top-1 at a rate at least
    :data:`IMAGE_MARGIN` above p0, the larger of chance and the null (the same reconstructions among images the
    update never saw, :func:`fedvit.audit.metrics.null_reid`), with that many hits of ``images`` at binomial
    P < :data:`REID_SIGNIFICANCE` under p0. The one rule the report and the frontier use."""
    from scipy.stats import binom

    if images <= 0:
        return False
    p0 = min(max(null or 0.0, chance or 0.0), 1.0)
    hits = int(math.floor(top1 * images + 1e-9))
    if hits == 0 or top1 - p0 < IMAGE_MARGIN:
        return False
    return float(binom.sf(hits - 1, images, p0)) < REID_SIGNIFICANCE


def out_of_reach(value: float | None) -> bool:
    """Whether a null threshold sits at or above the largest value its figure takes (AUC 1, TPR 100%)."""
    return value is not None and value >= 1.0 - 1e-12


def membership_reach(figures: Judgement) -> tuple[str, ...]:
    """The figures whose null no value can clear: each membership null is a threshold (the 99.9% quantile of
    within-class shuffles, mapped back from the family's standardised maximum), so it can sit at or above the
    largest value its figure takes (AUC 1, TPR 100%), where no figure clears it. Empty: the null is within reach."""
    null = figures.null
    at = null.tpr(figures.judged_at)
    return tuple(name for name, value in (("AUC", null.auc), ("TPR", at)) if out_of_reach(value))


def needed_text(needed: int | None, members: int) -> str:
    """How many members a null out of reach would need (:class:`MembershipEvidence`), as the report says it."""
    return f"not resolvable with {counted(members, 'member')}: at least about {needed} needed"


def counted(n: int, noun: str) -> str:
    """"1 member", "2 members"."""
    return f"{n} {noun}{'s' * (n != 1)}"


def threshold_text(value: float | None, figure: str) -> str:
    """A null as what it is, the threshold a figure must exceed ("AUC > 0.930", "TPR > 94.3%"), or "no AUC can
    clear it" where it is :func:`out_of_reach`."""
    if value is None:
        return f"no {figure} null"
    if out_of_reach(value):
        return f"no {figure} can clear it"
    return f"{figure} > " + (f"{value:.3f}" if figure == "AUC" else f"{value:.1%}")


def null_text(null: RocFigures, at: str | None = None, members: int | None = None) -> str:
    """A membership null's AUC and (at ``at``, "0.01" or "resolution") TPR thresholds in one phrase: "clears at AUC >
    0.930, TPR > 94.3%", or "no AUC can clear it with 2 members" where a threshold is out of reach."""
    tpr = None if at is None else null.tpr(at)
    figures = [("AUC", null.auc)] + ([("TPR", tpr)] if tpr is not None else [])
    reachable = [threshold_text(value, name) for name, value in figures if not out_of_reach(value)]
    blocked = [name for name, value in figures if out_of_reach(value)]
    if not blocked:
        return "clears at " + ", ".join(reachable)
    text = f"no {' or '.join(blocked)} can clear it"
    text += "" if members is None else f" with {counted(members, 'member')}"
    return text + (f" ({', '.join(reachable)})" if reachable else "")


# ---------------------------------------------------------------------------- the evidence per update


@dataclasses.dataclass(frozen=True)
class LabelEvidence:
    """Label counts against the prior (:func:`label_evidence`); ``audit.json`` holds it field by field
    (:func:`fedvit.audit.json_fields.as_json`)."""

    status: str  # MEASURED, UNVERIFIED or NOT_MEASURED
    why: str = ""  # not measured or unverified: the reason
    error: float | None = None  # the share of the images the counts misplace, against the truth
    null_error: float | None = None  # the prior's
    margin: float | None = None  # LABEL_MARGIN, where judged
    images: int | None = None  # the images judged on (measured)
    clears: bool = False  # :func:`labels_clear`
    images_needed: int | None = None  # the fewest images at which exact counts would clear this prior
    benchmarked_error: str | None = None  # unverified: the method's benchmarked error, or the truth beside it
    prior_shares: list[float] | None = None  # what the report's label picture draws
    true_counts: list[int] | None = None


@dataclasses.dataclass(frozen=True)
class ImageEvidence:
    """The best attack's re-identification against its null (:func:`image_evidence`)."""

    status: str  # MEASURED or NOT_MEASURED
    why: str = ""
    top1: float | None = None  # the reconstructions' top-1 re-identification of their true images
    null_top1: float | None = None  # the same reconstructions among images the update never saw
    chance: float | None = None
    margin: float | None = None  # IMAGE_MARGIN, where judged
    clears: bool = False  # :func:`images_clear`
    psnr: float | None = None
    images: int | None = None


@dataclasses.dataclass(frozen=True)
class PowerEvidence:
    """What the audit could have seen of membership in an update like this one: a simulated update with known
    members (the power twin, :func:`fedvit.audit.membership_runs.simulated_power`) judged as the update is, beside
    the AUC the same scores show on the update; where it is a SecAgg+ aggregate, ``per_member`` is one member's
    images in a simulated aggregate of that N."""

    status: str  # MEASURED or NOT_MEASURED
    why: str = ""
    scores: str = ""  # the scores the twin is judged on
    simulated: Judgement | None = None  # the twin judged
    aggregate_of: int | None = None  # a SecAgg+ aggregate: the members simulated
    observed_auc: float | None = None  # the strongest of the same scores on the update
    could_have_seen: bool = False  # the twin clears its null
    per_member: PowerEvidence | None = None


@dataclasses.dataclass(frozen=True)
class MembershipEvidence:
    """The strongest membership score against its null within the family (:func:`membership_evidence`);
    ``audit.json`` holds the judged figures beside the verdict's fields."""

    status: str  # MEASURED or NOT_MEASURED
    why: str = ""
    figures: Judgement | None = flattened(Judgement)
    clears: bool = False  # the figures clear their null (:func:`fedvit.audit.membership_stats.clears_null`)
    blocked: tuple[str, ...] = ()  # the figures whose null no value can clear (:func:`membership_reach`)
    members_to_resolve: int | None = None  # where blocked: about how many members would bring the null in reach
    power: PowerEvidence | None = None
    privacy: PrivacyEvidence | None = None
    measures: str | None = None  # what the members are, where not the update's own images

    @property
    def resolvable(self) -> bool:
        """Whether a figure could clear the null at all."""
        return not self.blocked

    @property
    def measured(self) -> bool:
        return self.status == MEASURED


# one update's evidence of one leakage type
Evidence = LabelEvidence | ImageEvidence | MembershipEvidence


def label_evidence(counts: np.ndarray | None, why: str, accuracy: float | None, prior: float | None,
                   unverified_error: str | None, rests_on: str | None = None,
                   images: int | None = None) -> LabelEvidence:  # fmt: skip
    """Label counts against the prior. ``accuracy``/``prior``: label accuracy of the counts and of the prior
    against the truth (None without it); ``unverified_error``: the method's benchmarked error, stated instead;
    ``rests_on``: what the counts' relation assumes that is not the client's verified recipe (another optimiser
    than SGD, an assumed batch size or epoch count): the counts are then never judged, only estimated, and their
    error against the truth is stated beside, not weighed."""
    if counts is None:
        return LabelEvidence(NOT_MEASURED, why)
    if rests_on is not None:
        why = f"the counts rest on {rests_on}"
        if accuracy is None or prior is None:
            return LabelEvidence(UNVERIFIED, why, benchmarked_error=why)
        return LabelEvidence(UNVERIFIED, why, 1.0 - accuracy, 1.0 - prior, benchmarked_error=(
            f"{why}; against the truth they misplace {1 - accuracy:.1%} of the images (the prior {1 - prior:.1%}), "
            "not judged"))  # fmt: skip
    if accuracy is None or prior is None:
        return LabelEvidence(UNVERIFIED, "no ground truth recorded and no --data",
                             benchmarked_error=unverified_error or "exact for one step (the head-bias formula)")
    error, null = 1.0 - accuracy, 1.0 - prior
    images = max(int(images or np.sum(counts)), 1)  # the client's images (the counts sum to them)
    return LabelEvidence(MEASURED, "", error, null, LABEL_MARGIN, images, labels_clear(error, null, images),
                         label_images_needed(null))  # fmt: skip


def image_evidence(scores: ImageScores | None, images: int, why: str) -> ImageEvidence:
    """The best attack's re-identification against its null (see :func:`fedvit.audit.metrics.null_reid`)."""
    if scores is None or scores.reid_top1 is None:
        return ImageEvidence(NOT_MEASURED, why)
    top1, null = scores.reid_top1, scores.reid_null
    if null is None:
        return ImageEvidence(NOT_MEASURED, "too few decoys for a null (2 per true image)", top1)
    chance = scores.reid_chance
    return ImageEvidence(MEASURED, "", top1, null, chance, IMAGE_MARGIN, images_clear(top1, null, chance, images),
                         scores.psnr, images)  # fmt: skip


def membership_evidence(figures: Judgement | None, why: str, power: PowerEvidence | None = None,
                        privacy: PrivacyEvidence | None = None, measures: str | None = None) -> MembershipEvidence:
    """Membership figures against the within-class shuffled-label null (:func:`fedvit.audit.membership_stats.judge`)
    and whether that null can be cleared at all (:func:`membership_reach`); where it cannot, about how many members
    would bring it within reach (:func:`fedvit.audit.membership_stats.members_needed`, at least one more)."""
    if figures is None:
        return MembershipEvidence(NOT_MEASURED, why, power=power, measures=measures)
    blocked = membership_reach(figures)
    needed = max(figures.members_needed, figures.members + 1) if blocked else None
    return MembershipEvidence(MEASURED, "", figures, figures.clears_null, blocked, needed, power, privacy,
                              measures)  # fmt: skip


DEFAULT_DELTA = 1e-5  # the δ of the empirical ε where canaries are audited without a claim


@dataclasses.dataclass(frozen=True)
class PrivacyEvidence:
    """The empirical lower bound on ε an update's membership test proves (:func:`privacy_evidence`), beside its null
    and the client's DP claim where it makes one."""

    empirical_epsilon: float
    null: float  # the largest bound over ``null_draws`` within-class shuffles
    null_draws: int
    delta: float
    confidence: float
    thresholds: int  # the thresholds the bound was taken over (its Bonferroni split)
    at: dict[str, float] | None  # the TPR and FPR of the threshold that gave it
    members: int
    non_members: int
    scores: list[str]
    claimed_epsilon: float | None = None  # None: no claim on record
    claim: str | None = None  # the claim as the report names it
    consistent: bool | None = None  # None: no claim to test


def privacy_evidence(claim: PrivacyClaim | None, found: PrivacyBound) -> PrivacyEvidence:
    """The empirical lower bound on ε (:func:`fedvit.audit.membership_stats.privacy_bound`) beside its null and the
    client's claim (a :class:`fedvit.observed.recipe.PrivacyClaim`, or None): a bound above both the claimed ε and
    its null violates the claim at the bound's confidence; consistent otherwise."""
    bound = PrivacyEvidence(found.epsilon_lower, found.null, found.null_draws, found.delta, found.confidence,
                            found.thresholds, found.at, found.members, found.non_members, found.scores)  # fmt: skip
    if claim is None:
        return bound
    violated = found.epsilon_lower > max(claim.epsilon, found.null)
    return dataclasses.replace(bound, claimed_epsilon=claim.epsilon, claim=claim.described(), consistent=not violated)


def claims_tested(items: list[MembershipEvidence]) -> list[PrivacyEvidence]:
    """The DP claims an update's membership evidence tested, over ``items`` (membership evidence per update)."""
    return [p for e in items if (p := e.privacy) is not None and p.claimed_epsilon is not None]


def privacy_part(items: list[MembershipEvidence]) -> tuple[str, bool | None]:
    """The DP claims over the updates: their wording and whether one is violated (None: no claim tested)."""
    claimed = claims_tested(items)
    if not claimed:
        return "", None
    broken = [p for p in claimed if not p.consistent]
    bound = max(p.empirical_epsilon for p in claimed)
    confidence = claimed[0].confidence
    null = max(p.null for p in claimed)
    if broken:
        return (f"DP claim violated in {len(broken)} of {len(claimed)} update(s): empirical ε ≥ {bound:.2f} at "
                f"{confidence:.0%} confidence (null {null:.2f}) against the claimed "
                f"{broken[0].claim}"), True  # fmt: skip
    return (f"consistent with the claimed ε in {len(claimed)} of {len(claimed)} update(s) (empirical ε ≥ "
            f"{bound:.2f} at {confidence:.0%} confidence, null {null:.2f}; "
            f"claimed {claimed[0].claim})"), False  # fmt: skip


def unmeasured_part(kind: str, unverified: int, why: str) -> tuple[str, None]:
    """A leakage type no update measured: estimated in ``unverified`` update(s) (``why``: the first one's stated
    error), else not measured (``why``: the first update's reason)."""
    if unverified:
        return f"{kind} estimated for {unverified} update(s), unverified ({why})", None
    return f"{kind} not measured ({why or 'no updates'})", None


def beyond_part(kind: str, hits: int, measured: int, detail: str) -> tuple[str, bool]:
    return f"{kind} beyond the null in {hits} of {measured} update(s) ({detail})", hits > 0


def labels_part(items: list[LabelEvidence]) -> tuple[str, bool | None]:
    """Label counts over the updates: the wording and whether they leak (None: nothing measured)."""
    measured = [e for e in items if e.status == MEASURED]
    if not measured:
        unverified = [e for e in items if e.status == UNVERIFIED]
        if unverified:
            return unmeasured_part("labels", len(unverified), unverified[0].benchmarked_error or "")
        return unmeasured_part("labels", 0, items[0].why if items else "")
    detail = (f"mean error {np.mean([e.error for e in measured]):.1%} vs prior "
              f"{np.mean([e.null_error for e in measured]):.1%}, margin {LABEL_MARGIN:.0%}; "
              f"{sum(e.error == 0 for e in measured)} of {len(measured)} exactly right")  # fmt: skip
    return beyond_part("labels", sum(e.clears for e in measured), len(measured), detail)


def images_part(items: list[ImageEvidence]) -> tuple[str, bool | None]:
    """Re-identification over the updates: the wording and whether images leak (None: nothing measured)."""
    measured = [e for e in items if e.status == MEASURED]
    if not measured:
        return unmeasured_part("images", 0, items[0].why if items else "")
    detail = (f"re-identified {np.mean([e.top1 for e in measured]):.0%} top-1 vs null "
              f"{np.mean([e.null_top1 for e in measured]):.0%}")  # fmt: skip
    return beyond_part("images", sum(e.clears for e in measured), len(measured), detail)


def membership_part(items: list[MembershipEvidence]) -> tuple[str, bool | None]:
    """Membership over the updates: the wording and whether it leaks (None: nothing measured)."""
    measured = [e for e in items if e.measured]
    if not measured:
        return unmeasured_part("membership", 0, items[0].why if items else "")
    hits = sum(e.clears for e in measured)
    figures = [e.figures for e in measured]
    detail = (f"AUC {np.mean([f.auc for f in figures]):.3f}; null: "
              f"{null_text(hardest_null(figures))} in the hardest update")  # fmt: skip
    resolved = [f for f in figures if f.tpr_at_1_percent is not None]
    if resolved:
        hardest = max(f.null.tpr_at_1_percent for f in resolved)
        detail += (f", TPR@1% FPR {np.mean([f.tpr_at_1_percent for f in resolved]):.1%} (null: "
                   f"{threshold_text(hardest, 'TPR')} in the hardest)")  # fmt: skip
    if unresolvable := sum(not e.resolvable for e in measured):
        detail += f"; not resolvable in {unresolvable} (too few members for any figure to clear the null)"
    if len(resolved) < len(measured):  # the verdict read TPR at the resolution there
        detail += (f"; 1% FPR not resolved in {len(measured) - len(resolved)} (too few non-members per class: "
                   "TPR read at the resolution)")  # fmt: skip
    detail += power_summary([e.power for e in measured], hits)
    on_average = sum(e.figures.auc > e.figures.null.auc and not e.clears for e in measured)
    if on_average:  # Carlini et al.: an AUC says the update informs on average, not that any member is exposed
        detail += (f"; AUC alone beyond its null in {on_average}: membership information on average, no "
                   "member singled out at 1% FPR")  # fmt: skip
    return beyond_part("membership", hits, len(measured), detail)


def hardest_null(figures: list[Judgement]) -> RocFigures:
    """The highest AUC null among ``figures`` (the update hardest to clear), as a null of its own."""
    return RocFigures(max(f.null.auc for f in figures))


PARTS = {"labels": labels_part, "membership": membership_part, "images": images_part}  # by LEAKAGE_KINDS


def power_summary(powers: list[PowerEvidence | None], hits: int) -> str:
    """What the audit could have seen (each update's simulated power), and how a verdict without a hit reads."""
    powered = [p for p in powers if p is not None and p.status == MEASURED]
    if not powered:
        return ""
    seen = sum(p.could_have_seen for p in powered)
    text = (f"; power of the loss scores: simulated updates like these, with known members, clear their null in "
            f"{seen} of {len(powered)} (AUC {np.mean([p.simulated.auc for p in powered]):.3f})")  # fmt: skip
    if hits == 0 and seen == len(powered):
        text += ": the audit could have seen membership like the simulation's, and these updates hold less"
    elif hits == 0 and seen == 0:
        text += ": with these scores the audit could not have seen membership in such updates at this budget"
    return text


def rounds_part(combined: list[MembershipEvidence]) -> tuple[str, bool | None]:
    """Membership per client over its updates (``combined``: each client's): the wording and whether it leaks (None:
    nothing measured)."""
    measured = [e for e in combined if e.measured]
    if not measured:
        return "membership over rounds not measured", None
    hits = sum(e.clears for e in measured)
    figures = [e.figures for e in measured]
    return (f"membership over each client's updates beyond the null for {hits} of {len(measured)} client(s) "
            f"(AUC {np.mean([f.auc for f in figures]):.3f}; null: {null_text(hardest_null(figures))} in the "
            "hardest)", hits > 0)  # fmt: skip


def verdict_detail(updates: list[dict[str, Evidence]], nothing: str,
                   combined: list[MembershipEvidence] | None = None) -> str:  # fmt: skip
    """One line: per leakage type, the evidence against its null (and, for clients with several updates, their
    membership over them). "LEAKS" only where a figure clears its margin; "no evidence at this budget" where
    everything measured stayed within it; "unverified" where nothing could be checked."""
    if not updates:
        return nothing
    parts = {kind: PARTS[kind]([u[kind] for u in updates]) for kind in LEAKAGE_KINDS}
    if combined:
        parts["rounds"] = rounds_part(combined)
    privacy = privacy_part([u["membership"] for u in updates])
    if privacy[1] is not None:
        parts["privacy"] = privacy
    leaks = [text for text, hit in parts.values() if hit]
    rest = [text for text, hit in parts.values() if not hit]
    if leaks:
        return "LEAKS: " + "; ".join(leaks) + ". Also: " + "; ".join(rest)
    if any(hit is False for _, hit in parts.values()):
        return "no evidence at this budget: " + "; ".join(text for text, _ in parts.values())
    return "unverified: " + "; ".join(text for text, _ in parts.values())
