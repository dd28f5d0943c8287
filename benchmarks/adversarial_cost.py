"""Cost of federated adversarial training: a local step with Madry PGD-7 vs a natural step, and FedWAvg's
aggregation vs FedAvg's.

1. One local SGD step (batch 24, the paper's) on the tiny ViT (32 px) and ViT-S/16 (224 px): natural, Madry AT
   with r = 0.5 (the paper's) and r = 1.0 (PGD-7 on the whole batch; expected ≈ 8× = 7 attack passes + 1).
2. Server aggregation of 5 ViT-S/16 client models: fedvit's FedWAvg (eq. 3, weights from the head) vs fedvit's
   FedAvg (Flower's weighted average), on the same replies.

Usage: uv run --frozen python benchmarks/adversarial_cost.py [--repeats 3] [--skip-vit-s]
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from common import TINY, VIT_S16, median_time

from fedvit.clients.adversarial import PGD, madry_adversary
from fedvit.clients.training import local_epochs
from fedvit.core.data import ImageSet
from fedvit.core.model import build_model, get_weights
from fedvit.strategies import FedAvg, FedWAvg
from tests.helpers import FakeGrid, reply

BATCH = 24


def step_time(model_config, img_size: int, ratio: float | None, repeats: int) -> float:
    """Median seconds of one local step (one batch) with Madry AT at ``ratio`` (None: natural)."""
    torch.manual_seed(0)
    model = build_model(model_config, 10)
    pixels = torch.randint(0, 256, (BATCH, 3, img_size, img_size), dtype=torch.uint8)
    images = ImageSet(labels=np.arange(BATCH) % 10, num_classes=10, pixels=pixels)
    cpu = torch.device("cpu")

    def step():
        adversary = None if ratio is None else madry_adversary(PGD(steps=7), ratio, [0, 1, 0], cpu)
        local_epochs(
            model, images, np.arange(BATCH), epochs=1, batch_size=BATCH, lr=0.01, momentum=0.9, img_size=img_size,
            rng=np.random.default_rng(0), device=cpu, adversary=adversary,
        )  # fmt: skip

    step()  # warm-up
    return median_time(repeats, step)


def aggregation_times(repeats: int) -> tuple[float, float]:
    from flwr.app import Array, ArrayRecord, ConfigRecord

    model = build_model(VIT_S16, 10)
    weights = get_weights(model)
    rng = np.random.default_rng(0)
    clients = [{k: v + rng.normal(0, 1e-3, v.shape).astype(np.float32) for k, v in weights.items()} for _ in range(5)]
    replies = [reply(11 + i, c, **{"num-examples": 100 + i}) for i, c in enumerate(clients)]
    global_record = ArrayRecord({k: Array(v) for k, v in weights.items()})
    times = []
    for strategy in (FedAvg(min_nodes=1), FedWAvg(q=10.0, last_layer_names=("head.weight", "head.bias"), min_nodes=1)):
        grid = FakeGrid({11 + i: i for i in range(5)})
        list(strategy.configure_train(1, global_record, ConfigRecord({"lr": 0.1}), grid))
        times.append(median_time(repeats, strategy.aggregate_arrays, 1, replies))
    return times[0], times[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-vit-s", action="store_true")
    args = parser.parse_args()
    from flwr.supercore.task_identity import TaskIdentity  # messages outside a Flower run need an identity

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
    models = [("tiny ViT, 32 px", TINY, 32)] + ([] if args.skip_vit_s else [("ViT-S/16, 224 px", VIT_S16, 224)])
    print("| model | natural step s | Madry r=0.5 s (×) | PGD-7 on the whole batch s (×) |\n|---|---|---|---|")
    for name, config, size in models:
        natural = step_time(config, size, None, args.repeats)
        half = step_time(config, size, 0.5, args.repeats)
        full = step_time(config, size, 1.0, args.repeats)
        print(f"| {name} | {natural:.3f} | {half:.3f} ({half / natural:.1f}×) | {full:.3f} ({full / natural:.1f}×) |")
    fedavg, fedwavg = aggregation_times(args.repeats)
    print(f"\nAggregation of 5 ViT-S/16 client models: FedAvg {fedavg:.3f} s, FedWAvg {fedwavg:.3f} s "
          f"({fedwavg / fedavg:.2f}×)")  # fmt: skip
    print(f"command: uv run --frozen python benchmarks/adversarial_cost.py --repeats {args.repeats}"
          + (" --skip-vit-s" if args.skip_vit_s else ""))  # fmt: skip


if __name__ == "__main__":
    main()
