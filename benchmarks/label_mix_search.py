"""Where the label-distribution estimate loses beyond one local epoch, and a measured lead to a better one.

The audit's RLU-class estimate (attacks/label_distribution.py) simulates the client's local training on auxiliary
images drawn with a class mix and solves the head's least squares for the counts n; it repeats that a few times,
each estimate setting the next simulation's mix (a fixed-point iteration from the uniform mix). On skewed clients
beyond one epoch that iteration moves slowly and its error stays near the prior's, while the same least squares
with the true mix is close. This benchmark measures, per client update (the test app's CNN, Dirichlet(0.5)
classes, B = 32, lr 0.01, momentum 0.9 on no record):

* ``audit``: the audit's estimate as it ships (momentum estimated, :data:`PASSES` passes);
* ``oracle``: one least squares with the simulation run at the true counts (the method's ceiling);
* ``residual search``: Gauss–Newton on the self-consistency residual r(n) = (S(n) n − rhs) / ‖rhs‖, S(n) the
  system of a simulation at mix n (momentum 0.9 given), its Jacobian by finite differences (one simulation per
  class), steps of 1, 2 or 4 times the Gauss–Newton step kept when r falls — not in the audit: it costs ~10x the
  simulations and has no benchmarked bound yet.

    uv run python -m benchmarks.label_mix_search        # writes docs/results/data/label-mix-search.csv
"""

from __future__ import annotations

import time

import numpy as np
import torch

from attacks.label_distribution import (
    Auxiliary,
    estimate,
    head_rows,
    integer_counts,
    prior_accuracy,
    scaled_rhs,
    simulate,
    solve_counts,
)
from attacks.labels import label_accuracy
from benchmarks.common import ROOT, write_csv
from benchmarks.label_distribution import client_update, models

OUT = ROOT / "docs" / "results" / "data" / "label-mix-search.csv"
CASES = [(size, epochs, seed) for epochs in (1, 3, 5) for size in (1000,) for seed in (0, 1, 2)]
MOMENTUM = 0.9
ITERATIONS = 5
FD_SHARE = 0.05  # finite-difference step: this share of the client's images moved into one class


def residual_search(obs, aux: Auxiliary, rhs: np.ndarray, total: int, seed: int) -> tuple[np.ndarray, float, int]:
    """Gauss–Newton on r(n) from the uniform mix; returns the counts, their residual and the simulations run."""
    scale = np.linalg.norm(rhs)
    simulations = 0

    def residual(n: np.ndarray) -> np.ndarray:
        nonlocal simulations
        simulations += 1
        system = simulate(obs, aux, integer_counts(n, total), MOMENTUM, seed).system
        return (system @ n - rhs) / scale

    classes = len(obs.update[obs.head_bias])
    n = np.full(classes, total / classes)
    r = residual(n)
    for _ in range(ITERATIONS):
        h = FD_SHARE * total
        jacobian = np.empty((len(r), classes))
        for k in range(classes):  # move h images into class k, keeping Σn = N
            d = -n / total * h
            d[k] += h
            jacobian[:, k] = (residual(n + d) - r) / h
        step = solve_counts(jacobian, jacobian @ n - r, total) - n
        tried = [m for t in (1.0, 2.0, 4.0) if ((m := n + t * step) >= 0).all()]
        scored = [(np.linalg.norm(r_new), m, r_new) for m in tried for r_new in [residual(m)]]
        if not scored or min(s[0] for s in scored) >= np.linalg.norm(r):
            break
        _, n, r = min(scored, key=lambda s: s[0])
    return integer_counts(n, total), float(np.linalg.norm(r)), simulations


def row(size: int, epochs: int, seed: int) -> dict:
    obs, (_, labels), aux_data = client_update(models()["cnn"], epochs, size, "Dirichlet(0.5)", seed)
    aux = Auxiliary(*aux_data, "2,000 other images")
    truth = np.bincount(labels, minlength=10)
    started = time.perf_counter()
    audit = estimate(obs, aux, seed).counts
    audit_s = time.perf_counter() - started
    rhs = scaled_rhs(obs, head_rows(obs), MOMENTUM)
    oracle = integer_counts(solve_counts(simulate(obs, aux, truth, MOMENTUM, seed).system, rhs, size), size)
    started = time.perf_counter()
    searched, residual, simulations = residual_search(obs, aux, rhs, size, seed)
    error = lambda counts: round(1 - label_accuracy(counts, labels), 4)  # noqa: E731
    return {
        "images": size, "local epochs": epochs, "client seed": seed,
        "prior error": round(1 - prior_accuracy(aux.prior(10), labels), 4),
        "audit error": error(audit), "audit s": round(audit_s, 1),
        "oracle error": error(oracle),
        "search error": error(searched), "search residual": round(residual, 3),
        "search simulations": simulations, "search s": round(time.perf_counter() - started, 1),
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
