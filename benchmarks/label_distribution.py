"""The label distribution a multi-step FedAvg update leaks at realistic scale: label-count error (RLU-class
simulation, fedvit.attacks.label_distribution) against the prior's, over local epochs (1, 3, 5), client dataset size,
IID and Dirichlet(0.5) classes, for the third-party app's CNN and fedvit's tiny ViT (membership at the same scale:
benchmarks/membership_onset.py).

One client's update per row: its images from the test app's offline generator (five Dirichlet draws of class
shares, one IID), SGD with momentum 0.9 (on no record: the attack estimates it), lr 0.01, batch 32, from the
model's initialisation; auxiliary data: 2,000 images of the same generator that the client never
held.

    uv run python -m benchmarks.label_distribution --workers 2   # writes docs/results/data/label-distribution.csv
    # a subset (the search's before/after table): --models cnn --sizes 500,1000 --epochs 1,3 --out FILE.csv
    # the attack's own run-to-run spread: the same client updates, another draw of the attack's simulations
    uv run python -m benchmarks.label_distribution --workers 2 --attack-draw 1 --out FILE.csv
    # the class-mix search capped at K Gauss-Newton steps per start (its error against its time; 5 is the audit's)
    uv run python -m benchmarks.label_distribution --workers 2 --search-steps 0,1,2,5 --epochs 1 --out FILE.csv
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from benchmarks.common import ROOT, TINY, search_caps, side_by_side, write_csv

sys.path.insert(0, str(ROOT / "tests" / "thirdparty_app"))

from fedvit.attacks.holdings import Auxiliary
from fedvit.attacks.label_distribution import estimate, prior_accuracy  # noqa: E402
from fedvit.attacks.labels import label_accuracy  # noqa: E402
from fedvit.audit.fedvit_run import fedvit_spec as fedvit_model_spec  # noqa: E402
from fedvit.core.config import Config  # noqa: E402
from fedvit.core.model import classify  # noqa: E402
from fedvit.observed.model_spec import ModelSpec, head_bias  # noqa: E402
from fedvit.observed.observation import Observation  # noqa: E402
from fedvit.observed.recipe import ClientRecipe

OUT = ROOT / "docs" / "results" / "data" / "label-distribution.csv"
EPOCHS, SIZES, PARTITIONS = (1, 3, 5), (500, 1000, 2000), {"IID": 0.0, "Dirichlet(0.5)": 0.5}
DRAWS = {"IID": (0,), "Dirichlet(0.5)": (0, 1, 2, 3, 4)}  # client seeds: each Dirichlet draw is another class mix
LR, MOMENTUM, BATCH = 0.01, 0.9, 32
# --attack-draw K seeds the estimate with client seed + K · ATTACK_DRAW (0: the committed table's seeds): another
# draw of the auxiliary images, the shuffles and the other-draw check, the client's update unchanged
ATTACK_DRAW = 104_729


def models() -> dict[str, ModelSpec]:
    return {"cnn": ModelSpec("cnnapp.task:Net", app_dir=str(ROOT / "tests" / "thirdparty_app")),
            "vit": fedvit_model_spec(Config(model=TINY), 10)}  # fmt: skip


def epochs_of(model: torch.nn.Module, images: np.ndarray, labels: np.ndarray, seed: int) -> Iterator[int]:
    """The client's training, one epoch per step (yields the epochs done): shuffled batches, SGD with momentum
    (one optimiser throughout), mean cross-entropy, as the test app trains."""
    generator = torch.Generator().manual_seed(seed)
    x, y = torch.as_tensor(images, dtype=torch.float32), torch.as_tensor(labels)
    optimiser = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    for epoch in itertools.count(1):
        model.train()
        order = torch.randperm(len(y), generator=generator)
        for first in range(0, len(y), BATCH):
            batch = order[first : first + BATCH]
            optimiser.zero_grad()
            F.cross_entropy(classify(model, x[batch]), y[batch]).backward()
            optimiser.step()
        yield epoch


def epochs_at(
    model: torch.nn.Module, images: np.ndarray, labels: np.ndarray, seed: int, wanted: tuple[int, ...]
) -> Iterator[int]:  # fmt: skip
    """The epochs of :func:`epochs_of` that are in ``wanted`` (the model trained that far), ending after the last."""
    for epoch in epochs_of(model, images, labels, seed):
        if epoch > max(wanted):
            return
        if epoch in wanted:
            yield epoch


def train(model: torch.nn.Module, images: np.ndarray, labels: np.ndarray, epochs: int, seed: int) -> None:
    """``epochs`` epochs of :func:`epochs_of`."""
    for done in epochs_of(model, images, labels, seed):
        if done == epochs:
            return


def client_update(spec: ModelSpec, epochs: int, size: int, partition: str, seed: int = 0):
    """One client's update from the model's initialisation, as the eavesdropper sees it; with the client's images
    and labels and the 2,000 other images (auxiliary data and non-members)."""
    from cnnapp.task import make_images

    torch.manual_seed(seed)
    model = spec.build(10)
    received = {n: p.detach().numpy().copy() for n, p in model.state_dict().items()}
    images, labels = make_images(size, 100 + seed, PARTITIONS[partition])
    others, other_labels = make_images(2000, 999)
    train(model, images, labels, epochs, seed)
    sent = {n: p.detach().numpy().copy() for n, p in model.named_parameters()}
    client = ClientRecipe(size, BATCH, epochs, LR, 0.0, 0.0, 0, False, True, momentum_known=False)
    skeleton = spec.build(10)
    obs = Observation(update=sent, received=received, num_classes=10, spec=spec, skeleton=skeleton,
                      client=client, head_bias=head_bias(skeleton) or "")  # fmt: skip
    return obs, (images, labels), (others, other_labels)


def row(name: str, spec: ModelSpec, epochs: int, size: int, partition: str, seed: int = 0, draw: int = 0,
        search_steps: int | None = None) -> dict:  # fmt: skip
    """One client's update (``seed``) and its label estimate under the attack's draw ``draw``; ``search_steps``: the
    class-mix search capped at that many steps per start (None: the audit's own cap, and no budget columns)."""
    obs, (images, labels), (others, other_labels) = client_update(spec, epochs, size, partition, seed)
    aux = Auxiliary(others, other_labels, "2,000 other images")
    started = time.perf_counter()
    found = estimate(obs, aux, seed + draw * ATTACK_DRAW, search_steps)
    label_seconds = time.perf_counter() - started
    budget = {} if search_steps is None else {"search steps": search_steps, "simulations": found.simulations}
    return {
        "model": name, "partition": partition, "client seed": seed, "images": size, "local epochs": epochs,
        "label error": round(1 - label_accuracy(found.counts, labels), 4),
        "prior error": round(1 - prior_accuracy(aux.prior(10), labels), 4),
        "momentum estimated": found.momentum, "label s": round(label_seconds, 1),
    } | ({"attack draw": draw} if draw else {}) | budget  # fmt: skip


def run_case(case: tuple[str, int, int, str, int, int, int | None], threads: int) -> dict:
    """One row on ``threads`` threads (a pool's workers run side by side on one each)."""
    torch.set_num_threads(threads)
    name, epochs, size, partition, seed, draw, search_steps = case
    return row(name, models()[name], epochs, size, partition, seed, draw, search_steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=1, help="rows run side by side, one thread each "
                        "(1: one row at a time on 2 threads)")  # fmt: skip
    parser.add_argument("--models", default=",".join(models()), help="comma-separated (default: all)")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)), help="client images, comma-separated")
    parser.add_argument("--epochs", default=",".join(map(str, EPOCHS)), help="local epochs, comma-separated")
    parser.add_argument("--attack-draw", type=int, default=0, help="another draw of the attack's simulations on the "
                        "same client updates (0: the committed table's)")  # fmt: skip
    parser.add_argument("--search-steps", default=None, help="the class-mix search capped at these Gauss-Newton steps "
                        "per start, comma-separated (a row per cap; default: the audit's own cap, no budget columns)")
    parser.add_argument("--out", type=Path, default=OUT, help="the CSV written")
    args = parser.parse_args()
    caps = search_caps(parser, args.search_steps)
    if args.search_steps is not None and args.out == OUT:
        parser.error("--search-steps caps the search: name its file with --out (the committed table is the audit's)")
    if args.attack_draw < 0:
        parser.error(f"--attack-draw must be >= 0, got {args.attack_draw}")
    if args.attack_draw and args.out == OUT:
        parser.error("--attack-draw writes another draw: name its file with --out (the committed table is draw 0)")
    workers = args.workers
    names, sizes, epoch_list = args.models.split(","), [int(s) for s in args.sizes.split(",")], [
        int(e) for e in args.epochs.split(",")]  # fmt: skip
    unknown = sorted(set(names) - set(models()))
    if unknown:
        parser.error(f"unknown models {unknown} (one of {', '.join(models())})")
    cases = [(name, epochs, size, partition, seed, args.attack_draw, cap) for name in names for partition in PARTITIONS
             for size in sizes for epochs in epoch_list for seed in DRAWS[partition] for cap in caps]  # fmt: skip
    rows = []
    for result in side_by_side(run_case, cases, workers):
        rows.append(result)
        print(result, flush=True)
    write_csv(rows, args.out)


if __name__ == "__main__":
    main()
