"""fedvit's FedAvg through SecAgg+ against plain FedAvg: the same clients, seeds and rounds, in one process
(``tests.helpers.run_in_process``: fedvit's ServerApp and ClientApp with their mods, no network). Per number of
clients: the largest entry-wise difference of the global models after round 1 and after the last round, the bound
the run states for round 1 (``secagg-error-bound``: N·(2·clipping-range/quantization-range)/Σ r_i), the final
central accuracies, and the seconds per round of each (SecAgg+'s key agreement, secret sharing and masking
included; the four messages per client cost more on a real network).

    uv run --frozen python -m benchmarks.secagg_agreement [--sizes 2,5,10] [--rounds 3]
    # writes docs/results/data/secagg-agreement.csv
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file

from benchmarks.common import ROOT, write_csv

sys.path.insert(0, str(ROOT))

from tests.helpers import run_in_process  # noqa: E402

OUT = ROOT / "docs" / "results" / "data" / "secagg-agreement.csv"
CONFIG = {
    "capture.enabled": False, "strategy": "fedavg", "lr": 0.05, "momentum": 0.9, "local-epochs": 1,
    "data.synthetic-train-size": 600, "data.synthetic-test-size": 200, "data.partitioner": "dirichlet",
    "run-name": "run", "checkpoint-keep": 1000,
}  # fmt: skip


def difference(a: Path, b: Path) -> float:
    first, second = load_file(a), load_file(b)
    return max(float(np.abs(first[k].astype(np.float64) - second[k]).max()) for k in first)


def run(root: Path, clients: int, rounds: int, secure: bool) -> tuple[Path, dict, float]:
    config = CONFIG | {"out-dir": str(root), "num-server-rounds": rounds, "min-nodes": clients,
                       "secagg.enabled": secure}  # fmt: skip
    started = time.perf_counter()
    run_dir, _ = run_in_process(config, clients)
    seconds = (time.perf_counter() - started) / rounds
    metrics = {e["round"]: e for e in json.loads((run_dir / "metrics.json").read_text())["rounds"]}
    return run_dir, metrics, seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="2,5,10", help="numbers of clients (default %(default)s)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per run (default %(default)s)")
    args = parser.parse_args(argv)
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1  # what a ServerApp process sets
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        run(Path(tmp) / "warm-up", 2, 1, secure=False)  # imports and first-call costs stay out of the timings
        for n in [int(v) for v in args.sizes.split(",")]:
            plain_dir, plain, plain_s = run(Path(tmp) / f"plain-{n}", n, args.rounds, secure=False)
            secure_dir, secure, secure_s = run(Path(tmp) / f"secagg-{n}", n, args.rounds, secure=True)
            first, final = "checkpoints/round-0001.safetensors", "model.safetensors"
            row = {
                "clients": n,
                "rounds": args.rounds,
                "max difference round 1": f"{difference(plain_dir / first, secure_dir / first):.3g}",
                "stated bound round 1": f"{secure[1]['secagg-error-bound']:.3g}",
                f"max difference round {args.rounds}": f"{difference(plain_dir / final, secure_dir / final):.3g}",
                "plain accuracy": round(plain[args.rounds]["central-accuracy"], 4),
                "secagg accuracy": round(secure[args.rounds]["central-accuracy"], 4),
                "clipped entries": sum(int(secure[r]["secagg-clipped-entries"]) for r in range(1, args.rounds + 1)),
                "plain s/round": round(plain_s, 2),
                "secagg s/round": round(secure_s, 2),
            }
            print(row, flush=True)
            rows.append(row)
    write_csv(rows, OUT)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
