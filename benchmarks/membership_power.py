"""What could the audit have seen? Simulated power against observed membership figures: one client's update (the
third-party app's CNN, 1,000 images, IID or Dirichlet(0.5) classes, SGD momentum 0.9, lr 0.01, batch 32, local
epochs 1, 3, 10 and 30; the test app's blobs and photograph-like textures) judged by the audit's loss scores
(fedvit.attacks.membership: loss of the sent weights, raw and per class, loss drop; family null) against 2,000
images it never held; beside it the audit's power simulation (``simulated_power``): the same recipe, the client's
class counts and momentum, from the same received weights, on 1,000 images drawn from 4,000 other labelled images,
judged by the same scores against as many non-members. ``agree``: both clear their null, or neither.

    uv run python -m benchmarks.membership_power   # writes docs/results/data/membership-power.csv
"""

from __future__ import annotations

import time

import numpy as np
import torch

from benchmarks.common import ROOT, write_csv
from benchmarks.label_distribution import BATCH, LR, MOMENTUM, PARTITIONS, epochs_at, models
from benchmarks.membership_onset import images_of
from fedvit.attacks.holdings import Auxiliary, Candidates
from fedvit.attacks.membership import candidate_losses, loss_scores
from fedvit.audit.membership_runs import simulated_power
from fedvit.audit.membership_stats import Judgement, judge
from fedvit.observed.model_spec import head_bias
from fedvit.observed.observation import Observation
from fedvit.observed.recipe import ClientRecipe

OUT = ROOT / "docs" / "results" / "data" / "membership-power.csv"
EPOCHS, SIZE, OTHERS, POOL = (1, 3, 10, 30), 1000, 2000, 4000
DATA = ("app images", "textures")


def figures(found: Judgement) -> dict:
    return {"AUC": round(found.auc, 3), "null AUC": round(found.null.auc, 3),
            "TPR@1% FPR": found.tpr_at_1_percent, "null TPR@1%": None if found.null.tpr_at_1_percent is None
            else round(found.null.tpr_at_1_percent, 4), "clears": found.clears_null}  # fmt: skip


def rows(data: str, partition: str, seed: int = 0) -> list[dict]:
    spec = models()["cnn"]
    torch.manual_seed(seed)
    model = spec.build(10)
    received = {n: p.detach().numpy().copy() for n, p in model.state_dict().items()}
    images, labels = images_of(data, SIZE, 100 + seed, PARTITIONS[partition])
    candidates = Candidates((images, labels), images_of(data, OTHERS, 999, 0.0), "other images")
    pool = Auxiliary(*images_of(data, POOL, 555, 0.0), "4,000 other labelled images")
    skeleton, out = spec.build(10), []
    for epoch in epochs_at(model, images, labels, seed, EPOCHS):
        sent = {n: p.detach().numpy().copy() for n, p in model.named_parameters()}
        client = ClientRecipe(SIZE, BATCH, epoch, LR, MOMENTUM, 0.0, 0, False, True)
        obs = Observation(update=sent, received=received, num_classes=10, spec=spec, skeleton=skeleton,
                          client=client, head_bias=head_bias(skeleton) or "")  # fmt: skip
        started = time.perf_counter()
        observed, _, _ = judge(loss_scores(candidate_losses(obs, candidates)), candidates, seed)
        observed_s = time.perf_counter() - started
        counts = np.bincount(labels, minlength=10)
        started = time.perf_counter()
        simulated = simulated_power(obs, pool, counts, MOMENTUM, seed, OTHERS)
        out.append({"data": data, "partition": partition, "images": SIZE, "local epochs": epoch,
                    **{f"observed {k}": v for k, v in figures(observed).items()},
                    **{f"simulated {k}": v for k, v in figures(simulated).items()},
                    "agree": observed.clears_null == simulated.clears_null,
                    "observed s": round(observed_s, 1),
                    "simulation s": round(time.perf_counter() - started, 1)})  # fmt: skip
        print(out[-1], flush=True)
    return out


def main() -> None:
    torch.set_num_threads(2)
    found = [row for data in DATA for partition in PARTITIONS for row in rows(data, partition)]
    write_csv(found, OUT)


if __name__ == "__main__":
    main()
