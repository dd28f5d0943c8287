"""TPR at 0.1% and 1% FPR against the non-members per class: which figures the data resolve, their 95%
Clopper–Pearson intervals, and the per-class Gaussian fit (LiRA's offline test) where 0.1% is not resolved.

One client that memorises (the third-party app's CNN, 200 photograph-like textures, IID classes, 20 local epochs,
SGD momentum 0.9, lr 0.01, batch 32) is judged by the audit's loss scores (fedvit.audit.membership_stats.judge: the
strongest of the loss of the sent weights, raw and per class, and the loss drop, against the family null) with 10,
30, 100, 300 and 500 non-members per class (the audit scores at most 5,000 non-members: 500 per class of 10).

    uv run python -m benchmarks.membership_resolution   # writes docs/results/data/membership-resolution.csv
"""

from __future__ import annotations

import numpy as np
import torch

from benchmarks.common import ROOT, write_csv
from benchmarks.label_distribution import BATCH, LR, MOMENTUM, epochs_at, models
from benchmarks.membership_onset import images_of
from fedvit.attacks.holdings import Candidates
from fedvit.attacks.membership import candidate_losses, loss_scores
from fedvit.audit.membership_stats import Judgement, judge
from fedvit.observed.model_spec import head_bias
from fedvit.observed.observation import Observation
from fedvit.observed.recipe import ClientRecipe

OUT = ROOT / "docs" / "results" / "data" / "membership-resolution.csv"
SIZE, EPOCHS, PER_CLASS = 200, 20, (10, 30, 100, 300, 500)


def rounded(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def interval(found: Judgement, target: str) -> str | None:
    ci = found.operating_points[target].tpr_ci
    return None if ci is None else f"{ci[0]:.3f}–{ci[1]:.3f}"


def main() -> None:
    torch.set_num_threads(2)
    spec = models()["cnn"]
    torch.manual_seed(0)
    model = spec.build(10)
    received = {n: p.detach().numpy().copy() for n, p in model.state_dict().items()}
    images, labels = images_of("textures", SIZE, 100, 0.0)
    for _ in epochs_at(model, images, labels, 0, (EPOCHS,)):
        pass
    sent = {n: p.detach().numpy().copy() for n, p in model.named_parameters()}
    skeleton = spec.build(10)
    client = ClientRecipe(SIZE, BATCH, EPOCHS, LR, MOMENTUM, 0.0, 0, False, True)
    obs = Observation(update=sent, received=received, num_classes=10, spec=spec, skeleton=skeleton,
                      client=client, head_bias=head_bias(skeleton) or "")  # fmt: skip
    others, other_labels = images_of("textures", 6000, 999, 0.0)
    rows = []
    for per_class in PER_CLASS:
        keep = np.concatenate([np.flatnonzero(other_labels == k)[:per_class] for k in range(10)])
        candidates = Candidates((images, labels), (others[keep], other_labels[keep]), "other textures")
        found, _, _ = judge(loss_scores(candidate_losses(obs, candidates)), candidates, 0)
        rows.append({
            "non-members per class": found.non_members_per_class, "members": found.members,
            "FPR resolution": rounded(found.fpr_resolution), "score": found.score, "AUC": round(found.auc, 3),
            "TPR@1% FPR": rounded(found.tpr_at_1_percent), "TPR@1% 95% CI": interval(found, "0.01"),
            "FPR reached (1%)": rounded(found.operating_points["0.01"].fpr),
            "TPR@0.1% FPR": rounded(found.tpr_at_0_1_percent), "TPR@0.1% 95% CI": interval(found, "0.001"),
            "TPR@0.1% needs (per class)": found.operating_points["0.001"].needs,
            "TPR@0.1% parametric": rounded(found.parametric),
            "fit agrees at 1%": None if found.fit_check is None else found.fit_check.agrees,
            "TPR@resolution": rounded(found.tpr_at_resolution),
            "TPR@resolution 95% CI": interval(found, "resolution"),
            "clears null": found.clears_null,
        })  # fmt: skip
        print(rows[-1], flush=True)
    write_csv(rows, OUT)


if __name__ == "__main__":
    main()
