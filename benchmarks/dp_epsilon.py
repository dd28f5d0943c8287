"""Empirical ε against claimed ε: a DP-GD client (the third-party test app's ``train_dp``: full batch, each image's
gradient clipped to norm 1, Gaussian noise, 100 steps at lr 3 on its 50 photograph-like images and the canaries it
included) for several noise multipliers, with 128 canaries planted (uniform noise with random labels, each included
with probability 1/2). The claimed ε is the app's accountant's (μ-GDP composition, δ = 1e-5); the empirical ε is
the audit's 95% lower bound from its loss scores on the canaries (fedvit.audit.membership_stats.privacy_bound), beside
its null (the largest bound over within-class shuffles of the canaries' included/left-out labels).
Noise multiplier 0 is no DP at all (claimed ε infinite).

    uv run python -m benchmarks.dp_epsilon   # writes docs/results/data/dp-epsilon.csv
"""

from __future__ import annotations

import math
import sys
import time

import numpy as np
import torch

from benchmarks.common import ROOT, write_csv
from fedvit.attacks.holdings import Candidates
from fedvit.attacks.membership import candidate_losses, loss_scores
from fedvit.attacks.scores import evenly
from fedvit.audit.evidence import privacy_evidence
from fedvit.audit.membership_stats import judge, privacy_bound
from fedvit.observed.model_spec import ModelSpec
from fedvit.observed.observation import Observation
from fedvit.observed.recipe import ClientRecipe, PrivacyClaim

APP = ROOT / "tests" / "thirdparty_app"
OUT = ROOT / "docs" / "results" / "data" / "dp-epsilon.csv"
NOISE, STEPS, LR, DELTA, CANARIES, SEEDS = (0.0, 1.0, 2.0, 5.0, 10.0, 35.0), 100, 3.0, 1e-5, 128, (0, 1)


def row(noise: float, seed: int) -> dict:
    sys.path.insert(0, str(APP))
    from cnnapp.task import Net, gdp_epsilon, load_data, make_canaries, train_dp

    images, labels = load_data(seed, 50, 7, 0.0, "textures")
    planted, planted_labels, included = make_canaries(seed, CANARIES, 7)
    x, y = np.concatenate([images, planted[included]]), np.concatenate([labels, planted_labels[included]])
    torch.manual_seed(seed)
    model = Net()
    received = {n: t.detach().numpy().copy() for n, t in model.state_dict().items()}
    started = time.perf_counter()
    train_dp(model, x, y, STEPS, LR, 1.0, noise, seed)
    trained = time.perf_counter() - started
    spec = ModelSpec("cnnapp.task:Net", app_dir=str(APP))
    client = ClientRecipe(len(y), len(y), STEPS, LR, 0.0, 0.0, 0, False)  # full batch
    sent = {n: t.detach().numpy() for n, t in model.state_dict().items()}
    obs = Observation(update=sent, received=received, num_classes=10, spec=spec, skeleton=Net(),
                      client=client, head_bias="fc3.bias")  # fmt: skip
    candidates = Candidates((planted[included], planted_labels[included]), (planted[~included],
                            planted_labels[~included]), "canaries left out", canaries=True)  # fmt: skip
    started = time.perf_counter()
    scores = loss_scores(candidate_losses(obs, candidates))
    found, _, _ = judge(scores, candidates, seed)
    member_labels, non_member_labels = evenly(*candidates.members)[1], evenly(*candidates.non_members)[1]
    bound = privacy_bound(scores, member_labels, non_member_labels, True, DELTA, seed)
    claimed = gdp_epsilon(STEPS, noise, DELTA) if noise > 0 else math.inf
    privacy = privacy_evidence(PrivacyClaim(claimed, DELTA, noise, 1.0, "the app's accountant"), bound)
    out = {"noise multiplier": noise, "seed": seed, "canaries in": int(included.sum()),
           "canaries out": int((~included).sum()), "claimed ε (δ 1e-5)": round(claimed, 3),
           "empirical ε ≥ (95%)": round(privacy.empirical_epsilon, 3), "null ε": round(privacy.null, 3),
           "consistent": privacy.consistent,
           "AUC": round(found.auc, 3), "score": found.score, "training s": round(trained, 1),
           "audit s": round(time.perf_counter() - started, 1)}  # fmt: skip
    print(out, flush=True)
    return out


def main() -> None:
    torch.set_num_threads(2)
    write_csv([row(noise, seed) for noise in NOISE for seed in SEEDS], OUT)


if __name__ == "__main__":
    main()
