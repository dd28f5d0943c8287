"""Empirical ε from canary clients against the accountant's ε, over noise multipliers (fedvit.strategies.canaries).

fedvit's default job (tiny ViT, synthetic data, 3 clients, FedAvg) in central DP (clipping norm 0.01), 5 rounds, with
200 canary clients in every aggregate, run in process for σ = 0.5, 1, 2, 4, 8. Per run: the accountant's ε at
δ = 10⁻⁵ (Rényi DP of the Gaussian mechanism over the 5 releases), the canaries' one-shot estimate, the μ it
measured and the μ a Gaussian mechanism of this σ has over 5 releases (√5/σ), with the exact ε at that μ.

    uv run python -m benchmarks.dp_canaries   # writes docs/results/data/dp-canaries.csv
"""

from __future__ import annotations

import json
import math
import tempfile

import numpy as np

from benchmarks.common import ROOT, write_csv
from fedvit.strategies.canaries import gaussian_epsilon

OUT = ROOT / "docs" / "results" / "data" / "dp-canaries.csv"
SIGMAS, ROUNDS, CANARIES, CLIP, DELTA = (0.5, 1.0, 2.0, 4.0, 8.0), 5, 200, 0.01, 1e-5


def main() -> None:
    from flwr.supercore.task_identity import TaskIdentity

    from tests.helpers import run_in_process  # the ServerApp against an in-process grid of fedvit's ClientApps

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1  # Messages outside a Flower run
    rows = []
    for sigma in SIGMAS:
        np.random.seed(0)  # Flower's noise draws from NumPy's global generator
        with tempfile.TemporaryDirectory() as out:
            config = {"out-dir": out, "run-name": "dp", "num-server-rounds": ROUNDS, "batch-size": 8,
                      "dp.mode": "central", "dp.noise-multiplier": sigma, "dp.clipping-norm": CLIP,
                      "dp.canaries": CANARIES, "dp.delta": DELTA}  # fmt: skip
            run_dir, _ = run_in_process(config)
            report = json.loads((run_dir / "dp-privacy.json").read_text())
        expected = math.sqrt(ROUNDS) / sigma
        rows.append({"noise multiplier": sigma, "rounds": ROUNDS, "clients": report["clients-per-round"],
                     "canaries": CANARIES, "delta": DELTA,
                     "accountant epsilon": round(report["accountant-epsilon"], 3),
                     "estimated epsilon": round(report["epsilon-estimate"], 3), "measured mu": round(report["mu"], 3),
                     "mechanism mu": round(expected, 3),
                     "mechanism epsilon": round(gaussian_epsilon(expected, DELTA), 3)})  # fmt: skip
        print(rows[-1], flush=True)
    write_csv(rows, OUT)


if __name__ == "__main__":
    main()
