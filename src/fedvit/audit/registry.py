"""Every leakage measure the audit knows, in the order it runs them: label counts, membership and the image attacks
alike. Each entry names the leakage type it gives evidence on, says whether it applies to an observation (its model,
its recipe, the defence its run config names, what the audit holds) and why not, and runs; :data:`JUDGES` turns the
findings of one type into its evidence against the type's null. Adding a measure is adding an entry here."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tqdm import tqdm

from fedvit.attacks import april
from fedvit.attacks.cocktail import cocktail_party
from fedvit.attacks.inversion import collusion_inversion, fedavg_aware_invert, invert
from fedvit.attacks.label_distribution import Auxiliary, benchmarked_error, prior_accuracy
from fedvit.attacks.labels import Recovered, label_accuracy, recover_labels_and_momentum
from fedvit.attacks.membership import Candidates, infer, reference_updates, split_for_references
from fedvit.attacks.observation import (
    Observation,
    Reconstruction,
    as_gradient,
    attacker_seed,
    has_vit_embeddings,
    recipe,
    simulated,
)
from fedvit.attacks.recipe import ClientRecipe
from fedvit.attacks.reidentification import Gallery
from fedvit.audit.evidence import image_evidence, label_evidence, membership_evidence
from fedvit.audit.metrics import as_batch, score
from fedvit.core.config import AuditConfig
from fedvit.core.params import QKV0_WEIGHT

LABELS = "labels (head-bias gradient)"
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
    if obs.config is None:
        return "this capture is another app's: its run config names no fedvit defence"
    mask_mode = obs.config.mask.mode if obs.masks is not None else None
    present = {
        "masks": mask_mode not in (None, "fixed-position"),
        "fixed-position": mask_mode == "fixed-position",
        "encryption": obs.config.encryption.enabled,
        "colluders": obs.config.encryption.enabled and bool(obs.known_images),
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
    inversion recovers from one update (it would spend its budget on a few steps and report noise)."""
    if (why := simulated(obs)) is not None:
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


@dataclass
class Held:
    """What the audit holds for one update beside the observation. Truth (``images``, ``labels``, ``gallery``;
    ``exact`` when they are exactly the update's) reaches only the scoring; ``aux`` (labelled images that are not
    the client's) and ``candidates`` (membership's) are what an attacker may hold. ``found``: what earlier
    measures left for later ones (the class counts the label estimate simulated; its momentum is in the recipe)."""

    images: np.ndarray | None
    labels: np.ndarray | None
    gallery: Gallery | None
    exact: bool
    budget: AuditConfig
    head: dict[str, Any]  # the update's columns of every report row
    aux: Auxiliary | None = None
    candidates: Candidates | None = None
    budgets: list[int] | None = None  # Adam steps per restart, one row each (default: the budget's own)
    device: str | None = None
    references: int = 0  # shadow updates behind a multi-step update's membership (0: the loss drop)
    position: str = ""  # "update k/n", for progress bars
    found: dict[str, Any] = field(default_factory=dict)


@dataclass
class Finding:
    """One measure on one update: its report rows, its line under the update's "attacks" (None: not listed), its
    evidence against its null (None where :data:`JUDGES` forms the type's evidence from several findings), what
    the report draws (a reconstruction and its scores, membership's score arrays), and the client's recipe where
    the measure estimated a value of it from the update (later measures and the report then use that recipe)."""

    rows: list[dict[str, Any]]
    status: str | None
    evidence: dict[str, Any] | None = None
    applied: bool = True
    reconstruction: Reconstruction | None = None
    scores: dict[str, Any] | None = None
    extra: Any = None
    recipe: ClientRecipe | None = None


@dataclass(frozen=True)
class Measure:
    """One registry entry: its report name, the leakage type it gives evidence on ("labels", "membership",
    "images"), why it does not apply (None: it does), how it runs, and what it reports when it does not apply."""

    name: str
    leakage: str
    why_not: Callable[[Observation, Held], str | None]
    run: Callable[[Observation, Held], Finding]
    refused: Callable[[Observation, Held, str], Finding] = lambda obs, held, why: Finding(
        [], f"not applicable: {why}", applied=False
    )


# ---- label counts: the head-bias gradient (one step) or the simulated local training (several)


def label_counts(obs: Observation, held: Held) -> Finding:
    """The label counts of one update, scored against the client's true labels where exactly known and beside the
    prior's; leaves the simulated counts in ``held.found`` for membership's shadow updates (which simulate the
    recipe's momentum: the record's, or the one estimated here)."""
    started = time.perf_counter()
    try:
        found = recover_labels_and_momentum(obs, held.aux)
    except ValueError as err:  # a diverged update or simulation: said, not raised
        found = Recovered(None, f"not estimated: {err}")
    if found.counts is not None and found.momentum is not None:
        held.found["simulated-counts"] = found.counts
    finding = _label_finding(obs, held, found.counts, found.note, started)
    if found.momentum_estimate:
        finding.recipe = recipe(obs).with_momentum(found.momentum, found.momentum_estimate)
    return finding


def _label_finding(
    obs: Observation, held: Held, counts: np.ndarray | None, note: str, started: float, applied: bool = True
) -> Finding:
    truth = held.labels if held.exact else None
    accuracy = None if counts is None or truth is None else label_accuracy(counts, truth)
    aux = held.aux
    prior = aux.prior(obs.num_classes) if aux is not None else np.full(obs.num_classes, 1 / obs.num_classes)
    null = None if accuracy is None else prior_accuracy(prior, truth)
    several = recipe(obs).several_steps
    evidence = label_evidence(counts, note, accuracy, null, benchmarked_error(obs) if several else None)
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
    return Finding([row], status, evidence, applied=applied)


LABEL_COUNTS = Measure(
    LABELS, "labels", lambda obs, held: labels_apply(obs), label_counts,
    refused=lambda obs, held, why: _label_finding(obs, held, None, why, time.perf_counter(), applied=False),
)  # fmt: skip


# ---- membership: the client's images against images it never held


def membership_scores(obs: Observation, held: Held) -> Finding:
    """Membership figures against the within-class shuffled null: against shadow updates where the label estimate
    simulated this update's training (and ``held.references`` > 0), else the loss drop."""
    candidates, shadows, pool = held.candidates, None, None
    counts = held.found.get("simulated-counts")
    if held.references > 0 and counts is not None and held.aux is not None:
        candidates, pool = split_for_references(candidates)
        shadows = reference_updates(obs, pool, counts, recipe(obs).momentum, attacker_seed(obs), held.references)
    result, inside, outside = infer(obs, candidates, attacker_seed(obs), shadows, pool)
    if held.references > 0 and shadows is None:  # asked for, not possible here: said
        result["reference"] += (" (shadow updates need a multi-step update whose label counts were estimated "
                                "on images that are not the client's)")  # fmt: skip
    return Finding([], None, membership_evidence(result, ""), extra=(inside, outside))


MEMBERSHIP = Measure(
    "membership", "membership",
    lambda obs, held: None if held.candidates is not None else (
        "needs the client's images and others: --data or ground truth"),
    membership_scores,
    refused=lambda obs, held, why: Finding([], None, membership_evidence(None, why), applied=False),
)  # fmt: skip


# ---- the image attacks, each scored against the client's images and re-identified among decoys


def image_measure(attack: Attack) -> Measure:
    """An image attack as a registry entry: one row per budget (``held.budgets`` for the optimising attacks)."""

    def run(obs: Observation, held: Held) -> Finding:
        rows, rec, scored = [], None, None
        for steps in (held.budgets or [held.budget.iterations]) if attack.optimising else [None]:
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
                    **scored,
                    "seconds": time.perf_counter() - start,
                    "note": rec.note,
                }
            )  # fmt: skip
        status = ("applied: " + rec.note) if rec.image is not None else ("could not run: " + rec.note)
        return Finding(rows, status, reconstruction=rec, scores=scored)

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


MEASURES: tuple[Measure, ...] = (LABEL_COUNTS, MEMBERSHIP, *(image_measure(a) for a in IMAGE_ATTACKS))


# ---- evidence per leakage type


def best_image(findings: dict[str, Finding]) -> tuple[str | None, dict[str, Any] | None]:
    """The image attack whose reconstruction scored the highest PSNR, and its scores (None, None: none scored)."""
    scored = {n: f.scores for n, f in findings.items() if f.scores and f.scores["psnr"] is not None}
    best = max(scored, key=lambda n: scored[n]["psnr"]) if scored else None
    return best, scored.get(best)


def _images(findings: dict[str, Finding], held: Held) -> dict[str, Any]:
    _, scores = best_image(findings)
    why = "no image attack ran" if scores is None and held.images is not None else "no ground truth and no --data"
    return image_evidence(scores, len(as_batch(held.images) or []) or 1, why)


# leakage type -> its evidence against its null from the findings of its measures
JUDGES: dict[str, Callable[[dict[str, Finding], Held], dict[str, Any]]] = {
    "labels": lambda findings, held: findings[LABELS].evidence,
    "membership": lambda findings, held: findings[MEMBERSHIP.name].evidence,
    "images": _images,
}


def measure_all(obs: Observation, held: Held) -> tuple[Observation, dict[str, Finding]]:
    """Every registry entry on one update, in order; each that does not apply reports why. A recipe value that a
    measure estimates from the update replaces the assumed one for every later measure; returns the observation
    with the recipe the measures ended on, and the findings."""
    findings = {}
    for measure in MEASURES:
        why = measure.why_not(obs, held)
        findings[measure.name] = found = measure.refused(obs, held, why) if why is not None else measure.run(obs, held)
        if found.recipe is not None:
            obs = dataclasses.replace(obs, client=found.recipe)
    return obs, findings


def evidence(findings: dict[str, Finding], held: Held) -> dict[str, dict[str, Any]]:
    """Per leakage type, its figures against its null (:data:`JUDGES`)."""
    kinds = {m.name: m.leakage for m in MEASURES}
    of_kind = lambda kind: {n: f for n, f in findings.items() if kinds[n] == kind}  # noqa: E731
    return {kind: judge(of_kind(kind), held) for kind, judge in JUDGES.items()}
