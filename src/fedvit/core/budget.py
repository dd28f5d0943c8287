"""The attack audit's budget per captured update: its own home, so that the attacks take it as a plain typed input
without importing fedvit's run configuration (``fedvit.core.config`` keeps it as the run's ``audit.*`` group)."""

from __future__ import annotations

from dataclasses import dataclass

# the audit's defaults, defined once here (light: the command line reads them without importing torch)
DEFAULT_DECOYS = 99  # test-split decoys beside each true image: a gallery of 100, chance 1%
MEMBERSHIP_REFERENCES = 8  # shadow updates per multi-step update (fewer where their time runs out)


def check_decoys(decoys: int) -> None:
    """``ValueError`` naming the flag where ``decoys`` is negative: the API, ``fedvit audit`` and its
    ``--benchmark`` all check it here, before any capture is read or update written."""
    if decoys < 0:
        raise ValueError(f"decoys (--decoys) must be >= 0, got {decoys}")


@dataclass(frozen=True)
class AuditConfig:
    """The attack audit's budget per captured update (fedvit.attacks.inversion; written into every report).

    ``iterations`` Adam steps per restart on the candidate images (step size ``lr`` on pixels in [0, 1], signed
    gradients, decayed ×0.1 at 3/8, 5/8 and 7/8), ``restarts`` random starts, batched (the best update match wins),
    ``max-seconds`` a wall-clock cap per update over all restarts; ``tv`` weights the total-variation prior and
    ``pos-weight`` the extra position-embedding cosine term (APRIL's optimisation variant); ``closed-form-start``
    starts the first restart from APRIL-E's closed form where it applies (one image, FedSGD, position gradient);
    ``keep`` picks the candidate returned: the lowest gradient match ("match") or the lowest total objective,
    match plus TV ("objective", as breaching does); ``patch-tv`` weights GradViT's patch-border prior; ``init``
    starts from uniform noise, from Gaussian noise on the normalised scale (N(0, 1) after the model's
    normalisation, clamped to the pixel box: breaching's start) or, a stronger threat model, from test-split
    images of the recovered classes;
    ``group-weight`` > 0 pulls each restart towards the restarts' registered mean from half-way
    (group consistency, Yin et al. 2021); ``prior-schedule`` = "cosine" scales the image priors (TV, patch-border
    TV) by ½(1 + cos(π·t/T)) at step t of T: strong early, gradient matching alone at the end (loss scheduling
    in the spirit of GradViT, whose own schedule balances a pretrained-CNN prior that fedvit cannot download).
    """

    iterations: int = 1500
    restarts: int = 2
    max_seconds: float = 90.0
    lr: float = 0.05
    tv: float = 0.05
    pos_weight: float = 1.0
    closed_form_start: bool = True
    keep: str = "match"
    patch_tv: float = 0.0
    init: str = "noise"
    group_weight: float = 0.0
    prior_schedule: str = "constant"

    def describe(self) -> str:
        start = "closed-form start where it applies" if self.closed_form_start else "random starts only"
        return (
            f"{self.iterations} Adam steps × {self.restarts} restart(s), ≤ {self.max_seconds:g} s per update, "
            f"lr {self.lr:g}, TV {self.tv:g}, position-embedding term {self.pos_weight:g}, {start}, keeps the "
            f"lowest {'gradient match' if self.keep == 'match' else 'total objective'}"
            + (f", patch-border TV {self.patch_tv:g}" if self.patch_tv else "")
            + (", starts from test-split images of the recovered classes" if self.init == "test-split" else "")
            + (", starts from Gaussian noise on the normalised scale" if self.init == "gaussian" else "")
            + (f", group consistency {self.group_weight:g}" if self.group_weight else "")
            + (", priors on a cosine schedule" if self.prior_schedule == "cosine" else "")
        )
