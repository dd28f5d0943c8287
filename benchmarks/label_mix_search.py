"""Why the label-distribution estimate searches the class mix, and from where.

The audit's RLU-class estimate (fedvit.attacks.label_distribution) simulates the client's local training on auxiliary
images drawn with a class mix and solves the head's least squares for the counts n. Passes alone (each estimate
setting the next simulation's mix, from the uniform mix) stall near the prior on skewed clients beyond one epoch;
the audit therefore follows them with a Gauss–Newton search on the self-consistency residual, from two starts (the
passes' estimate and the sent model's class shares on the auxiliary images), and keeps the lower residual; no
search runs where the passes' estimate is already self-consistent to within the simulation's draw-to-draw spread
(``class_mix_search``). Per
client update (the test app's CNN, Dirichlet(0.5) classes, B = 32, lr 0.01, momentum 0.9, as the audit estimates
it for these updates):

* ``passes``: the :data:`PASSES` passes alone, what the audit shipped before the search;
* ``from passes`` / ``from learned``: the search from each start (error and final residual; the learned start is
  searched for the table where the audit skips it, ``learned searched`` false);
* ``spread``: the draw-to-draw spread of the residual at the passes' estimate (within it, no search runs);
* ``kept``: the audit's rule (the lower residual of the starts it searched); ``simulations`` and ``s``: the audit's;
* ``oracle``: one least squares with the simulation run at the true counts (the method's ceiling).

    uv run python -m benchmarks.label_mix_search        # writes docs/results/data/label-mix-search.csv
"""

from __future__ import annotations

import time

import numpy as np
import torch

from benchmarks.common import ROOT, write_csv
from benchmarks.label_distribution import client_update, models
from fedvit.attacks.holdings import Auxiliary
from fedvit.attacks.label_distribution import (
    FROM_LEARNED,
    FROM_PASSES,
    SEARCH_STEPS,
    Systems,
    class_mix_search,
    head_rows,
    integer_counts,
    learned_mix,
    lowest_residual,
    passes,
    prior_accuracy,
    residual_search,
    scaled_rhs,
    solve_counts,
)
from fedvit.attacks.labels import label_accuracy
from fedvit.attacks.simulation import simulate

OUT = ROOT / "docs" / "results" / "data" / "label-mix-search.csv"
CASES = [(size, epochs, seed) for epochs in (1, 3, 5) for size in (1000,) for seed in (0, 1, 2, 3, 4)]
MOMENTUM = 0.9


def row(size: int, epochs: int, seed: int) -> dict:
    obs, (_, labels), aux_data = client_update(models()["cnn"], epochs, size, "Dirichlet(0.5)", seed)
    aux = Auxiliary(*aux_data, "2,000 other images")
    truth = np.bincount(labels, minlength=10)
    rows = head_rows(obs)
    error = lambda counts: round(1 - label_accuracy(counts, labels), 4)  # noqa: E731
    systems = Systems(obs, aux)
    started = time.perf_counter()
    from_passes = passes(obs, aux, rows, MOMENTUM, 0.0, seed, systems)[0]
    searched = class_mix_search(obs, aux, rows, from_passes, MOMENTUM, seed, systems)
    kept = searched[lowest_residual(searched)]
    seconds, simulations = time.perf_counter() - started, systems.runs
    first = searched[FROM_PASSES]
    learned = searched.get(FROM_LEARNED) or residual_search(
        obs, aux, rows, learned_mix(obs, aux), MOMENTUM, 0.0, seed, SEARCH_STEPS, systems
    )  # for the table: the search the audit skipped
    rhs = scaled_rhs(obs, rows, MOMENTUM)
    oracle = integer_counts(solve_counts(simulate(obs, aux, truth, MOMENTUM, seed).system, rhs, size), size)
    return {
        "images": size, "local epochs": epochs, "client seed": seed,
        "prior error": round(1 - prior_accuracy(aux.prior(10), labels), 4), "passes error": error(from_passes),
        "from passes error": error(first.counts), "from learned error": error(learned.counts),
        "from passes residual": round(first.residual, 3), "from learned residual": round(learned.residual, 3),
        "spread": round(first.spread, 3), "learned searched": FROM_LEARNED in searched,
        "kept error": error(kept.counts), "oracle error": error(oracle),
        "simulations": simulations, "s": round(seconds, 1),
    }  # fmt: skip


def main() -> None:
    torch.set_num_threads(2)
    rows = []
    for case in CASES:
        rows.append(row(*case))
        print(rows[-1], flush=True)
    write_csv(rows, OUT)


if __name__ == "__main__":
    main()
