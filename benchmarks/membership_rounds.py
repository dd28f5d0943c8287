"""Membership over rounds: one client's updates combined (fedvit.audit.membership_stats.over_rounds: each loss score's
per-update ranks, Stouffer) against the best of its single updates, for 1, 3 and 10 rounds. Two clients of 1,000
images each (the third-party app's CNN, photograph-like textures or the app's blobs, IID or Dirichlet(0.5) classes)
train 1 local epoch per round (SGD momentum 0.9, lr 0.01, batch 32) from the FedAvg of their previous round; the
first client's updates are judged against 2,000 images neither held.

    uv run python -m benchmarks.membership_rounds   # writes docs/results/data/membership-rounds.csv
"""

from __future__ import annotations

import time

import torch

from benchmarks.common import ROOT, write_csv
from benchmarks.label_distribution import BATCH, LR, PARTITIONS, models, train
from benchmarks.membership_onset import images_of
from fedvit.attacks.holdings import Candidates
from fedvit.attacks.membership import candidate_losses, loss_scores
from fedvit.audit.membership_stats import judge, over_rounds
from fedvit.observed.model_spec import head_bias
from fedvit.observed.observation import Observation
from fedvit.observed.recipe import ClientRecipe

OUT = ROOT / "docs" / "results" / "data" / "membership-rounds.csv"
ROUNDS, SIZE, OTHERS = (1, 3, 10), 1000, 2000
DATA = ("app images", "textures")


def rows(data: str, partition: str, seed: int = 0) -> list[dict]:
    spec = models()["cnn"]
    torch.manual_seed(seed)
    model, skeleton = spec.build(10), spec.build(10)
    alpha = PARTITIONS[partition]
    mine, theirs = images_of(data, SIZE, 100 + seed, alpha), images_of(data, SIZE, 200 + seed, alpha)
    candidates = Candidates(mine, images_of(data, OTHERS, 999, 0.0), "other images")
    client = ClientRecipe(SIZE, BATCH, 1, LR, 0.9, 0.0, 0, False, True)
    updates, singles, out = [], [], []
    for r in range(1, max(ROUNDS) + 1):
        received = {n: t.detach().clone() for n, t in model.state_dict().items()}
        sent = []
        for data_of in (mine, theirs):
            model.load_state_dict(received)
            train(model, *data_of, 1, seed * 1000 + r)
            sent.append({n: t.detach().clone() for n, t in model.state_dict().items()})
        obs = Observation(update={n: t.numpy() for n, t in sent[0].items()},
                          received={n: t.numpy() for n, t in received.items()}, num_classes=10,
                          spec=spec, skeleton=skeleton, client=client, head_bias=head_bias(skeleton) or "")  # fmt: skip
        updates.append(loss_scores(candidate_losses(obs, candidates)))
        singles.append(judge(updates[-1], candidates, seed)[0])
        model.load_state_dict({n: (sent[0][n] + sent[1][n]) / 2 for n in sent[0]})
        if r in ROUNDS:
            started = time.perf_counter()
            combined, _, _ = judge(over_rounds(updates), candidates, seed)
            best = max(singles, key=lambda s: s.auc)
            out.append({"data": data, "partition": partition, "images": SIZE, "rounds": r,
                        "combined AUC": round(combined.auc, 3),
                        "combined null AUC": round(combined.null.auc, 3),
                        "combined TPR@1% FPR": combined.tpr_at_1_percent,
                        "combined null TPR@1%": None if combined.null.tpr_at_1_percent is None
                        else round(combined.null.tpr_at_1_percent, 4),
                        "combined clears": combined.clears_null,
                        "best round AUC": round(best.auc, 3),
                        "rounds clearing alone": sum(s.clears_null for s in singles),
                        "combination s": round(time.perf_counter() - started, 1)})  # fmt: skip
            print(out[-1], flush=True)
    return out


def main() -> None:
    torch.set_num_threads(2)
    write_csv([row for data in DATA for partition in PARTITIONS for row in rows(data, partition)], OUT)


if __name__ == "__main__":
    main()
