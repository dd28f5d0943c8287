"""Every leakage measure the audit knows, in the order it runs them: label counts, membership and the image attacks
alike. Each entry names the leakage type it gives evidence on, says whether it applies to an observation (its model,
its recipe, the defence its run config names, what the audit holds) and why not, and runs; :func:`evidence` turns
the findings of one type into its evidence against the type's null. :func:`measure_all` runs them in stages, each
stage's typed output an explicit input of the next (:class:`Held`'s ``features``, ``estimate``, ``split``,
``losses``). Adding a measure is adding an entry here."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
from tqdm import tqdm

from fedvit.attacks import april
from fedvit.attacks.cocktail import cocktail_party
from fedvit.attacks.frozen_features import head_path, on_bank, on_features
from fedvit.attacks.holdings import Auxiliary, Candidates
from fedvit.attacks.inversion import collusion_inversion, fedavg_aware_invert, invert
from fedvit.attacks.label_distribution import benchmarked_error, prior_accuracy
from fedvit.attacks.labels import Recovered, label_accuracy, member_recipe, recover_labels_and_momentum
from fedvit.attacks.membership import (
    ALIGNMENT,
    LOSS_DROP,
    LOSS_SCORES,
    SENT_LOSS,
    SENT_LOSS_PER_CLASS,
    alignment_score,
    candidate_losses,
    loss_drop_score,
    reference_updates,
    sent_loss_score,
    split_for_references,
)
from fedvit.attacks.reidentification import Gallery
from fedvit.attacks.scores import Score, evenly
from fedvit.attacks.simulation import RecipeFit
from fedvit.audit.evidence import (
    DEFAULT_DELTA,
    LABELS,
    LEAKAGE_KINDS,
    MEASURED,
    NOT_MEASURED,
    Evidence,
    ImageEvidence,
    LabelEvidence,
    MembershipEvidence,
    PowerEvidence,
    image_evidence,
    label_evidence,
    membership_evidence,
    privacy_evidence,
)
from fedvit.audit.json_fields import keyed
from fedvit.audit.membership_runs import aggregate_power, simulated_power
from fedvit.audit.membership_stats import Judgement, Roc, judge, over_rounds, privacy_bound
from fedvit.audit.metrics import ImageScores, as_batch, score
from fedvit.core.budget import MEMBERSHIP_REFERENCES, AuditConfig
from fedvit.core.params import QKV0_WEIGHT
from fedvit.observed.observation import (
    Observation,
    Reconstruction,
    as_gradient,
    attacker_seed,
    has_vit_embeddings,
    not_plain_sgd,
    other_optimiser,
    partial_update,
    recipe,
    simulated,
    update_clipped,
)
from fedvit.observed.recipe import ClientRecipe

OPTIMISATION = "gradient matching (optimisation, defence-aware)"
FEDAVG_AWARE = "FedAvg-aware gradient matching (per-epoch image sets)"
COLLUSION_OPTIMISATION = "collusion key, then gradient matching"
BATCH_ICA = "patch-embedding ICA (batch)"


@dataclass(frozen=True)
class Attack:
    """One attack: its report name, why it does not apply to an observation (None: it does), and how it runs."""

    name: str
    why_not: Callable[[Observation], str | None]
    run: Callable[..., Reconstruction]
    optimising: bool = False  # takes (obs, budget, progress, device); its strength is a number of Adam steps


def _defence(obs: Observation, what: str) -> str | None:
    """Why a defence-aware attack does not apply: another app's capture, or a run without ``what``."""
    if not obs.defence.fedvit:
        return "this capture is another app's: its run config names no fedvit defence"
    mask_mode = obs.defence.mask_mode if obs.masks is not None else None
    encrypted = obs.defence.encryption != "off"
    present = {
        "masks": mask_mode not in (None, "fixed-position"),
        "fixed-position": mask_mode == "fixed-position",
        "encryption": encrypted,
        "colluders": encrypted and bool(obs.known_images),
    }[what]
    return None if present else f"no {what} in this run"


def _attention(obs: Observation) -> str | None:
    if (why := has_vit_embeddings(obs)) is not None:
        return why
    return None if QKV0_WEIGHT in obs.update else "no blocks.0.attn.qkv.weight in the update"


def _batch(obs: Observation) -> str | None:
    if (why := has_vit_embeddings(obs)) is not None:
        return why
    client = recipe(obs)
    return None if client.sends_gradient and client.batch > 1 else "needs one gradient of two or more images"


MAX_IMAGES = 64  # published image recovery from FedAvg updates: ≲ 50 images per client (Dimitrov et al., TMLR 2022)


def optimisable(obs: Observation) -> str | None:
    """Why the optimisation attack is not attempted: a recipe it cannot simulate, or more images than any published
    inversion recovers from one update (it would spend its budget on a few steps and report noise), or a partial
    update."""
    if (why := simulated(obs) or partial_update(obs) or other_optimiser(obs)) is not None:
        return why
    client = recipe(obs)
    if client.examples > MAX_IMAGES:
        return (
            f"not attempted: {client.examples} images over {client.steps} local step(s) in this update, beyond the "
            f'≤ {MAX_IMAGES} images per update that image inversion is known to recover (Dimitrov et al., "Data '
            'Leakage in Federated Averaging", TMLR 2022); the labels are what such an update gives away'
        )
    return None


def several_epochs(obs: Observation) -> str | None:
    """Why the FedAvg-aware attack does not apply: what the optimisation attack refuses, or fewer than two epochs."""
    if (why := optimisable(obs)) is not None:
        return why
    client = recipe(obs)
    if client.sends_gradient or client.epochs < 2:
        return "needs several local epochs over the same images (its image sets are per epoch)"
    return None


def labels_apply(obs: Observation) -> str | None:
    """Why label recovery cannot run (None when it can; it may still find the bias hidden)."""
    return simulated(obs)


def naive_embedding_route(obs: Observation) -> Reconstruction:
    """APRIL-E on the update read as a gradient (a FedAvg update's weight change is lr times a summed gradient)."""
    return april.embedding_route(as_gradient(obs))


def naive_attention_route(obs: Observation) -> Reconstruction:
    """APRIL's attention closed form on the update read as a gradient."""
    return april.attention_route(as_gradient(obs))


IMAGE_ATTACKS: tuple[Attack, ...] = (
    Attack("APRIL-E (naive)", has_vit_embeddings, naive_embedding_route),
    Attack("APRIL attention (naive)", _attention, naive_attention_route),
    Attack(BATCH_ICA, _batch, cocktail_party),
    Attack("fixed-position-aware", lambda obs: _defence(obs, "fixed-position"), april.fixed_position),
    Attack("APRIL-E mask-aware", lambda obs: _defence(obs, "masks"), april.masked_embedding_route),
    Attack("known-plaintext", lambda obs: _defence(obs, "encryption"), april.known_plaintext_route),
    Attack("known images (collusion)", lambda obs: _defence(obs, "colluders"), april.known_images_route),
    Attack(
        COLLUSION_OPTIMISATION,
        lambda obs: _defence(obs, "colluders") or optimisable(obs),
        collusion_inversion,
        optimising=True,
    ),  # fmt: skip
    Attack(OPTIMISATION, optimisable, invert, optimising=True),
    Attack(FEDAVG_AWARE, several_epochs, fedavg_aware_invert, optimising=True),
)


def applicable(obs: Observation) -> tuple[list[Attack], dict[str, str]]:
    """The image attacks that apply to ``obs``, and for each that does not, why."""
    chosen, refused = [], {}
    for attack in IMAGE_ATTACKS:
        why = attack.why_not(obs)
        if why is None:
            chosen.append(attack)
        else:
            refused[attack.name] = why
    return chosen, refused


# ---------------------------------------------------------------------------- every leakage measure


class MembershipSplit(NamedTuple):
    """What every membership score of one update is taken on: the candidates, the images that train the shadow
    updates (None: no shadows) and the seed of the null's shuffles."""

    candidates: Candidates
    pool: Auxiliary | None
    seed: int


@dataclass(frozen=True)
class LabelStage:
    """What the label estimate gives the measures after it (membership's shadow updates and power twin simulate the
    same training) and the report: its typed output, an explicit input of theirs (:attr:`Held.estimate`)."""

    simulated_counts: np.ndarray | None = None  # the class counts it simulated (None: none, or withheld)
    recipe_fit: RecipeFit | None = None  # how well the recipe's simulation reproduces the update
    fit_unchecked: str | None = None  # why that fit is not checked (None: it is)


@dataclass(frozen=True)
class FrozenFeatures:
    """A head fine-tuned on a frozen backbone, decided once per update (:func:`frozen_features`): the head's
    observation and the attacker's images as the head's inputs (None: the whole model runs), and what the report
    says of it (None: the whole model is trained)."""

    note: str | None = None
    head: Observation | None = None
    aux: Auxiliary | None = None
    candidates: Candidates | None = None


@dataclass(frozen=True)
class MeasureOptions:
    """The part of the audit's options the measures read (:attr:`fedvit.audit.pipeline.AuditOptions.measures`)."""

    budgets: tuple[int, ...] | None = None  # Adam steps per restart, one row each (default: the budget's own)
    references: int = MEMBERSHIP_REFERENCES  # shadow updates behind the shadow-alignment score (0: that score is off)
    fit_check: bool = True  # withhold the simulation's figures where the recipe does not fit (off: a mutation check)
    leakage: tuple[str, ...] = LEAKAGE_KINDS  # the leakage types asked for (--leakage); the others are not measured

    def __post_init__(self) -> None:
        if self.references < 0:
            raise ValueError(f"membership references must be >= 0, got {self.references}")
        if self.budgets is not None and (not self.budgets or min(self.budgets) < 1):
            raise ValueError(f"budgets must be Adam steps >= 1, got {list(self.budgets)}")
        if not self.leakage or set(self.leakage) - set(LEAKAGE_KINDS):
            raise ValueError(f"leakage must name some of {', '.join(LEAKAGE_KINDS)}, got {sorted(self.leakage)}")


@dataclass
class Held:
    """What the audit holds for one update beside the observation. Truth (``images``, ``labels``, ``gallery``;
    ``exact`` when they are exactly the update's) reaches only the scoring; ``aux`` (labelled images that are not
    the client's) and ``candidates`` (membership's) are what an attacker may hold. The stages of the audit fill the
    last four in order, each an explicit input of the measures after it (:func:`measure_all`)."""

    images: np.ndarray | None
    labels: np.ndarray | None
    gallery: Gallery | None
    exact: bool
    budget: AuditConfig
    head: dict[str, Any]  # the update's columns of every report row
    aux: Auxiliary | None = None
    candidates: Candidates | None = None
    options: MeasureOptions = field(default_factory=MeasureOptions)
    device: str | None = None
    position: str = ""  # "update k/n", for progress bars
    features: FrozenFeatures = field(default_factory=FrozenFeatures)  # the head on frozen features, or not
    estimate: LabelStage = field(default_factory=LabelStage)  # the label estimate's stage (empty before it runs)
    split: MembershipSplit | None = None  # every membership score is taken on it (decided before they run)
    losses: dict[str, tuple[np.ndarray, np.ndarray]] | None = None  # the candidates' losses, for the loss scores


@dataclass
class Outcome:
    """One measure on one update: its report rows, its line under the update's "attacks" (None: not listed), its
    evidence against its null (None where :func:`evidence` forms the type's evidence from several findings), what
    the report draws (a reconstruction and its scores, membership's score arrays), and the client's recipe where
    the measure estimated a value of it from the update (later measures and the report then use that recipe)."""

    rows: list[dict[str, Any]]
    status: str | None
    evidence: LabelEvidence | None = None  # the label counts' (the other types' are judged by :func:`evidence`)
    stage: LabelStage | None = None  # the label estimate's output for the measures after it
    applied: bool = True
    reconstruction: Reconstruction | None = None
    scores: ImageScores | None = None
    extra: Any = None
    recipe: ClientRecipe | None = None


@dataclass(frozen=True)
class Measure:
    """One registry entry: its report name, the leakage type it gives evidence on ("labels", "membership",
    "images"), why it does not apply (None: it does), how it runs, and what it reports when it does not apply."""

    name: str
    leakage: str
    why_not: Callable[[Observation, Held], str | None]
    run: Callable[[Observation, Held], Outcome]
    refused: Callable[[Observation, Held, str], Outcome] = lambda obs, held, why: Outcome(
        [], f"not applicable: {why}", applied=False
    )


# ---- label counts: the head-bias gradient (one step) or the simulated local training (several)


def label_counts(obs: Observation, held: Held) -> Outcome:
    """The label counts of one update, scored against the client's true labels where exactly known and beside the
    prior's; its :class:`LabelStage` (``Outcome.stage``) gives the simulated counts to membership's shadow updates
    (which simulate the recipe: the one stated, or the optimiser and momentum inferred here) and the recipe's fit
    to the update. Where
    the recipe's simulation does not reproduce the update (:class:`~fedvit.attacks.simulation.RecipeFit`),
    the counts are withheld, and so is every figure that rests on simulating that recipe."""
    started = time.perf_counter()
    try:
        found = recover_labels_and_momentum(obs, held.aux)
    except ValueError as err:  # a diverged update or simulation: said, not raised
        found = Recovered(None, f"not estimated: {err}")
    inferred = recipe(obs).with_inferred(found.optimiser, found.momentum, found.momentum_estimate,
                                         found.without_augment) if found.momentum_estimate else None  # fmt: skip
    stage = LabelStage(None, found.fit, unfittable(obs)) if found.fit is not None else LabelStage()
    if (misfit := recipe_misfit(dataclasses.replace(held, estimate=stage), obs)) is not None:
        note = f"withheld: {misfit}; the counts rest on simulating it ({found.note})"
        finding = _label_finding(obs, held, None, note, started)
    else:
        if found.counts is not None and found.momentum is not None:
            stage = dataclasses.replace(stage, simulated_counts=found.counts)
        finding = _label_finding(obs, held, found.counts, found.note, started)
    finding.recipe, finding.stage = inferred, stage
    return finding


def counts_rest_on(obs: Observation) -> str | None:
    """What the label counts of ``obs`` assume that is not the client's recipe as read and checked (None:
    nothing): another optimiser than SGD or an update clipped or noised (:func:`not_plain_sgd`), or, for new
    weights, a batch size or epoch count no record and no code states."""
    if (why := not_plain_sgd(obs)) is not None:
        return f"SGD's update, which this one is not ({why})"
    client = recipe(obs)
    if client.sends_gradient:
        return None
    assumed = [value for value in client.assumed() if value.startswith(("batch-size ", "epochs "))]
    return f"values no record and no code states ({'; '.join(assumed)})" if assumed else None


def unfittable(obs: Observation) -> str | None:
    """Why the recipe's fit is not checked for ``obs`` (None: it is): the label estimate simulates the plain steps,
    without DP-SGD's noise, LocalDpMod's or a clipping's scale, which then set the update's norm and direction."""
    client = recipe(obs)
    if client.privacy is not None and client.privacy.noise_multiplier:
        return "DP-SGD's noise is not in the label estimate's simulation"
    if client.update_noise is not None or update_clipped(obs):
        return "the update was clipped (and noised) after training: its norm and direction are not the steps'"
    return None


def recipe_misfit(held: Held, obs: Observation) -> str | None:
    """Why the figures that simulate the client's recipe are withheld: its simulation does not reproduce the update
    (None: it does, or nothing was simulated, or the check is off)."""
    fit = held.estimate.recipe_fit
    if fit is None or fit.fits or not held.options.fit_check or held.estimate.fit_unchecked:
        return None
    state = recipe(obs).source_of("client state")  # a state the simulations cannot restore: why it may not fit
    return f"recipe does not fit: {fit.described()}" + (f"; {state}" if state else "")


def _label_finding(
    obs: Observation, held: Held, counts: np.ndarray | None, note: str, started: float, applied: bool = True
) -> Outcome:
    if counts is not None and (why := not_plain_sgd(obs)) is not None:
        note = f"{note}; unverified: {why}, and these counts rest on SGD's update".lstrip("; ")
    truth = held.labels if held.exact else None
    accuracy = None if counts is None or truth is None else label_accuracy(counts, truth)
    aux = held.aux
    prior = aux.prior(obs.num_classes) if aux is not None else np.full(obs.num_classes, 1 / obs.num_classes)
    null = None if accuracy is None else prior_accuracy(prior, truth)
    several = recipe(obs).several_steps
    evidence = label_evidence(counts, note, accuracy, null, benchmarked_error(obs) if several else None,
                              counts_rest_on(obs), None if truth is None else len(truth))  # fmt: skip
    if counts is not None:  # what the report's label picture draws: the prior's shares and the true counts
        true_counts = None if truth is None else np.bincount(np.asarray(truth, np.int64), minlength=len(counts))
        evidence = dataclasses.replace(evidence, prior_shares=[round(float(s), 6) for s in prior],
                                       true_counts=None if true_counts is None else true_counts.tolist())
    found = "" if counts is None else ", ".join(f"{c}×{n}" for c, n in enumerate(counts) if n)
    row = held.head | {
        "attack": LABELS,
        "budget": None,
        "psnr": None,
        "ssim": None,
        "seconds": time.perf_counter() - started,
        "note": note if counts is None else f"class×count: {found}" + (f" ({note})" * bool(note)),
        "label-accuracy": accuracy,
        "labels": None if counts is None else {int(c): int(n) for c, n in enumerate(counts) if n},
    }
    status = f"not applicable: {note}" if counts is None else "applied" + (f" ({note})" if note else "")
    return Outcome([row], status, evidence, applied=applied)


LABEL_COUNTS = Measure(
    LABELS, "labels", lambda obs, held: labels_apply(obs), label_counts,
    refused=lambda obs, held, why: _label_finding(obs, held, None, why, time.perf_counter(), applied=False),
)  # fmt: skip


# ---- membership: the client's images against images it never held, one entry per score


def shadows_apply(obs: Observation, held: Held) -> str | None:
    """Why shadow updates cannot be trained for ``obs`` (None: they can)."""
    if held.options.references <= 0:
        return "no shadow updates asked for (--membership-references 0)"
    if (why := other_optimiser(obs) or recipe_misfit(held, obs)) is not None:
        return why
    if not counts_simulated(held):
        return ("shadow updates need a multi-step update whose label counts were estimated on images that are not "
                "the client's")  # fmt: skip
    return None


def counts_simulated(held: Held) -> bool:
    """Whether the label estimate simulated this update's training on labelled images that are not the client's
    (what the shadow updates and the power twin repeat)."""
    return held.estimate.simulated_counts is not None and held.aux is not None


def membership_split(obs: Observation, held: Held) -> MembershipSplit:
    """Decided once per update (:func:`measure_all`, after the label estimate), so that every score is judged on
    one split against one null: where shadow updates apply, half the non-members train them and every score is
    taken on the other half (:func:`~fedvit.attacks.membership.split_for_references`)."""
    candidates, pool = held.candidates, None
    if alignment_applies(obs, held) is None:
        candidates, pool = split_for_references(candidates)
    return MembershipSplit(candidates, pool, attacker_seed(obs))


def candidate_losses_of(obs: Observation, held: Held) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The candidates' losses under the received and sent weights, computed once (:func:`measure_all`) for the
    loss-based scores."""
    if held.losses is None:
        raise RuntimeError("the candidates' losses are computed before the membership scores (measure_all)")
    return held.losses


def alignment(obs: Observation, held: Held) -> Score:
    split = held.split
    shadows = reference_updates(obs, split.pool, held.estimate.simulated_counts, recipe(obs).momentum, split.seed,
                                held.options.references)  # fmt: skip
    return alignment_score(obs, split.candidates, shadows, split.pool)


def needs_candidates(obs: Observation, held: Held) -> str | None:
    return None if held.candidates is not None else "needs the client's images and others: --data or ground truth"


def alignment_applies(obs: Observation, held: Held) -> str | None:
    if (why := needs_candidates(obs, held) or shadows_apply(obs, held)) is not None:
        return why
    return "canaries: the loss scores only (half the excluded canaries would train the shadows)" if (
        held.candidates.canaries) else None  # fmt: skip


def membership_measure(name: str, score: Callable[[Observation, Held], Score],
                       why_not: Callable[[Observation, Held], str | None] = needs_candidates) -> Measure:  # fmt: skip
    """A membership score as a registry entry: its scores of the update's candidates, judged with the other
    membership entries' by :func:`judge_membership`."""

    def run(obs: Observation, held: Held) -> Outcome:
        found = score(obs, held)
        return Outcome([], f"applied: {found.reference}", extra=found)

    return Measure(f"membership: {name}", "membership", why_not, run)


MEMBERSHIP_SCORES: tuple[Measure, ...] = (
    membership_measure(SENT_LOSS, lambda obs, held: sent_loss_score(candidate_losses_of(obs, held), False)),
    membership_measure(SENT_LOSS_PER_CLASS, lambda obs, held: sent_loss_score(candidate_losses_of(obs, held), True)),
    membership_measure(LOSS_DROP, lambda obs, held: loss_drop_score(candidate_losses_of(obs, held))),
    membership_measure(ALIGNMENT, alignment, alignment_applies),
)


def judge_membership(obs: Observation, findings: dict[str, Outcome], held: Held
                     ) -> tuple[MembershipEvidence, Roc | None]:  # fmt: skip
    """The strongest membership score against its null within the family
    (:func:`fedvit.audit.membership_stats.judge`), what a simulated update like this one shows (:func:`power`)
    and, where the update claims DP or canaries are scored, the empirical ε; beside it the strongest score's judged
    values for the ROC plot (None: no score ran)."""
    scores = membership_scores(findings)
    if not scores:
        return membership_evidence(None, next(iter(findings.values())).status.removeprefix("not applicable: ")), None
    split, claim = held.split, recipe(obs).privacy
    delta = claim.delta if claim is not None else DEFAULT_DELTA if split.candidates.canaries else None
    figures, inside, outside = judge(scores, split.candidates, split.seed)
    member_labels, non_member_labels = evenly(*split.candidates.members)[1], evenly(*split.candidates.non_members)[1]
    roc = Roc(inside, outside, member_labels, non_member_labels, figures.fpr_resolution)
    privacy = None
    if delta is not None:  # on the loss scores, and the shadows' only where the recipe fits: it stands either way
        bound = privacy_bound(scores, member_labels, non_member_labels, split.candidates.canaries, delta, split.seed)
        privacy = privacy_evidence(claim, bound)
    return membership_evidence(figures, "", power(obs, held, figures), privacy), roc


def power_applies(obs: Observation, held: Held) -> str | None:
    """Why the power simulation cannot run for ``obs`` (None: it can)."""
    if (why := other_optimiser(obs) or recipe_misfit(held, obs)) is not None:
        return why
    if not counts_simulated(held):
        return ("needs the update's class counts estimated by simulating its local training on labelled images that "
                "are not the client's")  # fmt: skip
    if recipe(obs).sends_gradient:
        return "a gradient reply: the simulation is of weight updates"
    if (why := other_optimiser(obs)) is not None:
        return why
    if held.candidates.canaries:
        return "canaries are scored: the simulation stands for the client's own images"
    return None


def power(obs: Observation, held: Held, result: Judgement) -> PowerEvidence:
    """What the audit could have seen in this update (:func:`~fedvit.audit.membership_runs.simulated_power`), beside
    what it saw with the same scores."""
    if (why := power_applies(obs, held)) is not None:
        return PowerEvidence(NOT_MEASURED, why)
    split, counts = held.split, held.estimate.simulated_counts
    members = len(obs.meta.get("member-examples") or {})
    one = None
    if members >= 2 and len(held.aux.images) < (need := int(np.sum(counts))):
        return PowerEvidence(NOT_MEASURED, f"a simulated aggregate of {members} clients needs {need} distinct "
                             f"images, the auxiliary pool holds {len(held.aux.images)} (give more "
                             "--decoy-partitions)")  # fmt: skip
    if members >= 2:  # a SecAgg+ aggregate: N members simulated and averaged, the union and one member judged
        simulated, one = aggregate_power(dataclasses.replace(obs, client=member_recipe(obs)), held.aux,
                                         counts, recipe(obs).momentum, split.seed, result.non_members,
                                         members)  # fmt: skip
    else:
        simulated = simulated_power(obs, held.aux, counts, recipe(obs).momentum, split.seed, result.non_members)
    observed = max(result.scores[name].auc for name in LOSS_SCORES if name in result.scores)
    scores = f"the strongest of: {', '.join(LOSS_SCORES)}"
    aggregate = None if one is None else members
    per_member = None
    if one is not None:  # what the audit could see of one client's images in an aggregate of this N
        per_member = PowerEvidence(MEASURED, "", scores, one, aggregate, could_have_seen=one.clears_null)
    return PowerEvidence(MEASURED, "", scores, simulated, aggregate, observed, simulated.clears_null, per_member)


def membership_scores(findings: dict[str, Outcome]) -> list[Score]:
    """The membership scores one update's findings hold (the entries that applied)."""
    names = {m.name for m in MEMBERSHIP_SCORES}
    return [f.extra for n, f in findings.items() if n in names and f.applied]


def judge_rounds(updates: list[tuple[list[Score], MembershipSplit]]) -> MembershipEvidence:
    """One client's membership over its captured updates (:func:`fedvit.audit.membership_stats.over_rounds`), against
    the same family null with each shuffle applied to every update alike. Needs the same candidates in each
    update (the client's images and the non-members, as ``--data`` maps them)."""
    first = updates[0][1].candidates
    for _, split in updates[1:]:
        other = split.candidates
        if not all(
            np.array_equal(a, b)
            for a, b in zip((*first.members, *first.non_members), (*other.members, *other.non_members), strict=True)
        ):
            return membership_evidence(None, "the updates' membership candidates differ")
    scores = over_rounds([u[0] for u in updates])
    if not scores:
        return membership_evidence(None, "no membership score ran on every update")
    result, _, _ = judge(scores, first, updates[0][1].seed)
    return membership_evidence(result, "")


# ---- the image attacks, each scored against the client's images and re-identified among decoys


def image_measure(attack: Attack) -> Measure:
    """An image attack as a registry entry: one row per budget (``held.options.budgets`` for the optimising
    attacks)."""

    def run(obs: Observation, held: Held) -> Outcome:
        rows, rec, scored = [], None, None
        for steps in (held.options.budgets or [held.budget.iterations]) if attack.optimising else [None]:
            target = held.budget if steps is None else dataclasses.replace(held.budget, iterations=steps)
            start = time.perf_counter()
            rec = run_attack(attack, obs, target, held.device, held.position)
            scored = score(rec, held.images, held.gallery)
            rows.append(
                held.head | {
                    "attack": attack.name,
                    "budget": steps,
                    "steps-done": rec.steps,
                    "steps-asked": None if steps is None else steps * target.restarts,
                    **keyed(scored),
                    "seconds": time.perf_counter() - start,
                    "note": rec.note,
                }
            )  # fmt: skip
        status = ("applied: " + rec.note) if rec.image is not None else ("could not run: " + rec.note)
        return Outcome(rows, status, reconstruction=rec, scores=scored)

    return Measure(attack.name, "images", lambda obs, held: attack.why_not(obs), run)


def run_attack(attack: Attack, obs: Observation, budget: AuditConfig, device: str | None, position: str):
    """One image attack on one update; the optimisation attacks show a progress bar of their Adam steps."""
    if not attack.optimising:
        return attack.run(obs)
    with tqdm(total=None, desc=f"{position} {attack.name}", unit="step", leave=False) as bar:

        def progress(done: int, total: int) -> None:
            bar.total = total
            bar.update(done - bar.n)

        return attack.run(obs, budget, progress, device)


MEASURES: tuple[Measure, ...] = (LABEL_COUNTS, *MEMBERSHIP_SCORES, *(image_measure(a) for a in IMAGE_ATTACKS))


# ---- evidence per leakage type


def best_image(findings: dict[str, Outcome]) -> tuple[str | None, ImageScores | None]:
    """The image attack whose reconstruction scored the highest PSNR, and its scores (None, None: none scored)."""
    scored = {n: f.scores for n, f in findings.items() if f.scores and f.scores.psnr is not None}
    best = max(scored, key=lambda n: scored[n].psnr) if scored else None
    return best, scored.get(best)


def _images(obs: Observation, findings: dict[str, Outcome], held: Held) -> ImageEvidence:
    _, scores = best_image(findings)
    why = "no image attack ran" if scores is None and held.images is not None else "no ground truth and no --data"
    why = not_asked("images", held) or why
    return image_evidence(scores, len(as_batch(held.images) or []) or 1, why)


def frozen_features(obs: Observation, held: Held) -> FrozenFeatures:
    """A head fine-tuned on a frozen backbone: the head's observation and the attacker's images as its inputs,
    computed once per update (:func:`~fedvit.attacks.frozen_features.on_features`), or why the whole model runs."""
    if obs.trained is None:
        return FrozenFeatures()
    if held.aux is None:
        return FrozenFeatures("the whole model runs: no auxiliary images to compute features of")
    started = time.perf_counter()
    found = on_features(obs, held.aux, held.candidates)
    if isinstance(found, str):
        return FrozenFeatures(f"the whole model runs: {found}" + whole_model_cost(obs))
    aux, candidates = found.aux, found.candidates
    note = (
        f"the frozen layers' outputs computed once for {len(aux.images) + len(aux.noise)} auxiliary and "
        f"{0 if candidates is None else len(candidates.members[0]) + len(candidates.non_members[0])} "
        f"candidate images" + ("" if found.spread is None else f" ({found.spread.described()})") +
        f" in {time.perf_counter() - started:.1f} s; label counts and membership run on {head_path(obs)} alone"
    )  # fmt: skip
    return FrozenFeatures(note, found.obs, aux, candidates)


def bank_views(head_obs: Observation) -> int:
    """The views per image banked in a head observation's inputs (slot 0 is the image's own)."""
    return int(head_obs.spec.input_shape[1]) - 1


def whole_model_cost(obs: Observation) -> str:
    """What simulating the whole model costs where the head cannot run alone under a declared augmentation."""
    client = recipe(obs)
    if client.augment is None:
        return ""
    return (f"; every simulation runs the whole model on a fresh random view of each image at every visit "
            f"({client.examples * client.epochs} forward and backward passes per simulated update)")


def seen_by(leakage: str, obs: Observation, held: Held) -> tuple[Observation, Held]:
    """What a measure of ``leakage`` runs on: the head alone for label counts and membership where the update is a
    head on frozen features (:attr:`Held.features`), else the update as observed."""
    features = held.features
    if leakage == "images" or features.head is None:
        return obs, held
    head = dataclasses.replace(features.head, client=on_bank(obs.client, bank_views(features.head)))
    return head, dataclasses.replace(held, aux=features.aux, candidates=features.candidates)


def not_asked(leakage: str, held: Held) -> str | None:
    """Why the measures of ``leakage`` do not run because it was not asked for (None: they run). The label
    estimate also runs where asked-for membership figures rest on its simulation: the shadow updates and the power
    twin, neither of which runs where canaries are scored (:func:`alignment_applies`, :func:`power_applies`)."""
    if leakage in held.options.leakage:
        return None
    canaries = held.candidates is not None and held.candidates.canaries
    if leakage == "labels" and "membership" in held.options.leakage and not canaries:
        return None
    return f"not asked for: --leakage {','.join(held.options.leakage)}"


def run_measure(measure: Measure, obs: Observation, held: Held) -> Outcome:
    """One registry entry on the view of the update its leakage type runs on (:func:`seen_by`): its outcome, or
    why it does not apply or was not asked for (:func:`not_asked`)."""
    o, h = seen_by(measure.leakage, obs, held)
    why = not_asked(measure.leakage, h) or measure.why_not(o, h)
    return measure.refused(o, h, why) if why is not None else measure.run(o, h)


def membership_inputs(obs: Observation, held: Held) -> Held:
    """``held`` with the split every membership score is taken on and the candidates' losses (the loss scores'),
    decided once after the label estimate (the split rests on its stage: whether shadow updates apply); as it is
    where membership does not run."""
    o, h = seen_by("membership", obs, held)
    if not_asked("membership", h) is not None or needs_candidates(o, h) is not None:
        return held
    split = membership_split(o, h)
    return dataclasses.replace(held, split=split, losses=candidate_losses(o, split.candidates))


@dataclass(frozen=True)
class Measured:
    """One update's measures: the observation with the recipe they ended on, each entry's outcome by name, and the
    holdings with every stage's output (:attr:`Held.features`, ``estimate``, ``split``, ``losses``)."""

    obs: Observation
    findings: dict[str, Outcome]
    held: Held


def measure_all(obs: Observation, held: Held) -> Measured:
    """Every registry entry on one update, in stages, each stage's output an explicit input of the next: whether the
    update is a head on frozen features, the label estimate (a recipe value it estimates replaces the assumed one
    for every later measure; its :class:`LabelStage` is what the shadow updates and the power twin simulate), the
    membership split and losses, then every other entry in order. Each entry that does not apply, or whose leakage
    type was not asked for (:func:`not_asked`), reports why."""
    held = dataclasses.replace(held, features=frozen_features(obs, held))
    labels = run_measure(LABEL_COUNTS, obs, held)
    held = dataclasses.replace(held, estimate=labels.stage or LabelStage())
    if labels.recipe is not None:
        obs = dataclasses.replace(obs, client=labels.recipe)
    held = membership_inputs(obs, held)
    findings = {LABELS: labels} | {m.name: run_measure(m, obs, held) for m in MEASURES if m is not LABEL_COUNTS}
    return Measured(obs, findings, held)


@dataclass(frozen=True)
class Judged:
    """One update's evidence per leakage type against its null, and the strongest membership score's judged values
    (the report's ROC; None where no membership score ran)."""

    leakage: dict[str, Evidence]
    roc: Roc | None


def evidence(measured: Measured) -> Judged:
    """Per leakage type, its figures against its null: the label estimate's own, the membership family's
    (:func:`judge_membership`) and the best image attack's re-identification."""
    obs, findings, held = measured.obs, measured.findings, measured.held
    kinds = {m.name: m.leakage for m in MEASURES}
    of_kind = lambda kind: {n: f for n, f in findings.items() if kinds[n] == kind}  # noqa: E731
    o, h = seen_by("membership", obs, held)
    membership, roc = judge_membership(o, of_kind("membership"), h)
    images = _images(obs, of_kind("images"), held)
    return Judged({"labels": findings[LABELS].evidence, "membership": membership, "images": images}, roc)
