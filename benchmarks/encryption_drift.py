"""How far an encrypted run's decrypted global model drifts from the plain run's, round by round.

Runs the tiny CPU setup (5 clients, synthetic data, test-shard evaluation) in this process (no Ray) without and
with encryption ("paper" mode, same seed), for FedSGD and FedAvg, and prints per round the largest per-tensor
relative difference max|W_enc − W|/max|W| and the whole model's relative L2 difference. A control run with
E_a = I (only the permutation E_b, which is exact in float32) must give 0: any drift then comes from the
float32 rounding of the E_a products alone.

Usage: uv run --frozen python benchmarks/encryption_drift.py [--rounds 30]
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from fedvit.clients.encryption import KEY_ENV, EncryptionKey  # noqa: E402
from fedvit.core.config import Config  # noqa: E402
from tests.helpers import run_in_process  # noqa: E402


def model_at(run_dir: Path, rnd: int) -> dict[str, np.ndarray]:
    arrays = load_file(run_dir / "checkpoints" / f"round-{rnd:04d}.safetensors")
    return {k: v for k, v in arrays.items() if not k.startswith("strategy/")}


def differences(plain: dict, decrypted: dict) -> tuple[float, float]:
    worst = max(float(np.abs(decrypted[n] - w).max() / np.abs(w).max()) for n, w in plain.items())
    diff = np.concatenate([(decrypted[n] - w).ravel() for n, w in plain.items()])
    whole = np.concatenate([w.ravel() for w in plain.values()])
    return worst, float(np.linalg.norm(diff) / np.linalg.norm(whole))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1  # messages outside Flower's runtime
    logging.getLogger("flwr").setLevel(logging.ERROR)
    print(f"command: uv run --frozen python benchmarks/encryption_drift.py --rounds {args.rounds}")
    work = Path(tempfile.mkdtemp(prefix="fedvit-drift-"))
    os.environ["FEDVIT_CLIENT_STATE"] = str(work / "client-state")
    key = EncryptionKey.generate(192, 16, seed=5)  # the tiny model: L = 192, N = 16
    control = EncryptionKey(np.eye(192), key.perm, key.init_seed)
    shown = [r for r in (1, 2, 3, 5, 10, 20, 30, 50, 100) if r <= args.rounds]
    print(f"{'strategy':8s} {'key':7s} " + " ".join(f"{'round ' + str(r):>17s}" for r in shown))
    for strategy, extra in (("fedsgd", {}), ("fedavg", {"lr": 0.05})):
        config = (
            Config().to_dict()
            | extra
            | {
                "strategy": strategy,
                "num-server-rounds": args.rounds,
                "out-dir": str(work / strategy),
                "centralized-evaluation": False,
                "checkpoint-keep": args.rounds,
                "data.client-eval": "test-shard",
                "eval-every": args.rounds,
            }
        )
        plain_dir, _ = run_in_process(config | {"run-name": "plain"}, num_nodes=5)
        for label, k in (("E_a", key), ("E_a = I", control)):
            path = work / f"{label}.safetensors"
            k.save(path)
            os.environ[KEY_ENV] = str(path)
            enc_dir, _ = run_in_process(config | {"run-name": f"enc-{label}", "encryption.mode": "paper"}, num_nodes=5)
            cells = []
            for rnd in shown:
                worst, whole = differences(model_at(plain_dir, rnd), k.decrypt(model_at(enc_dir, rnd)))
                cells.append(f"{worst:8.1e}/{whole:8.1e}")
            print(f"{strategy:8s} {label:7s} " + " ".join(cells), flush=True)
    print("cells: largest per-tensor relative difference / whole-model relative L2 difference")


if __name__ == "__main__":
    main()
