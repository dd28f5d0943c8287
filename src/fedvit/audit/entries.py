"""What the report holds per update (:class:`UpdateAudit`) and per client over its updates (:class:`ClientRounds`), as
types: the pipeline builds them, the summary, audit.md and the pictures read them by attribute, and
:func:`fedvit.audit.json_fields.as_json` writes them into ``audit.json`` (the field ``recipe_fit`` as
``recipe-fit``)."""

from __future__ import annotations

import dataclasses

from fedvit.attacks.simulation import RecipeFit
from fedvit.audit.evidence import Evidence, ImageEvidence, LabelEvidence, MembershipEvidence
from fedvit.audit.json_fields import flattened
from fedvit.audit.metrics import ImageScores


@dataclasses.dataclass(frozen=True)
class RecipeFitted:
    """How well the simulated recipe reproduces the update (:class:`fedvit.attacks.simulation.RecipeFit`), and
    whether that was checked."""

    recipe: str
    scale: float
    cosine: float
    own_cosine: float
    cosine_bound: float
    direction_unresolved: bool  # the bound below LOWEST_COSINE_BOUND: never fits
    flatness: tuple[float, float]
    fits: bool
    checked: bool
    not_checked: str | None

    @classmethod
    def of(cls, fit: RecipeFit, checked: bool, not_checked: str | None) -> RecipeFitted:
        return cls(fit.recipe, fit.scale, fit.cosine, fit.own_cosine, fit.cosine_bound, fit.direction_unresolved,
                   tuple(fit.flatness), fit.fits, checked, not_checked)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class UpdateAudit:
    """One audited update: what was sent and by whom, the recipe and where each value came from, the labels
    recovered, each attack's status, the best attack's scores and the evidence per leakage type."""

    update: str
    node: int | str | None = None
    round: int | None = None
    partition: int | None = None
    sent: str = ""
    batch: int | None = None
    steps: int | None = None
    examples: int | None = None
    recipe: str = ""
    recipe_sources: list[tuple[str, str]] = dataclasses.field(default_factory=list)  # (key, "value (source)")
    app_code: str | None = None
    recipe_fit: RecipeFitted | None = None
    assumptions: list[str] = dataclasses.field(default_factory=list)  # values no record carries
    labels: dict[int, int] | None = None  # recovered class → count
    label_accuracy: float | None = None
    frozen_features: str | None = None  # a partial update: its head on cached features
    attacks: dict[str, str] = dataclasses.field(default_factory=dict)  # attack → its status
    best_attack: str | None = None
    leakage: dict[str, Evidence] = dataclasses.field(default_factory=dict)  # by LEAKAGE_KINDS
    seconds: float = 0.0
    best: ImageScores | None = flattened(ImageScores)  # the best attack's scores (None: no attack scored)
    membership_members: dict[str, MembershipEvidence] | None = None  # a SecAgg+ aggregate: each member's images

    @property
    def labels_evidence(self) -> LabelEvidence:
        return self.leakage["labels"]

    @property
    def membership(self) -> MembershipEvidence:
        return self.leakage["membership"]

    @property
    def images(self) -> ImageEvidence:
        return self.leakage["images"]


@dataclasses.dataclass(frozen=True)
class ClientRounds:
    """One client's membership over its captured updates combined (:func:`fedvit.audit.registry.judge_rounds`)."""

    client: str
    updates: list[str]
    membership: MembershipEvidence
    seconds: float
