"""When does one FedAvg update show membership? The audit's membership figures (fedvit.attacks.membership: loss drop,
ranked among each class's non-members, against the within-class shuffle null) on one client's update over local
epochs 1, 3, 5, 10, 30 and 100, for 1,000 and 2,000 images per client, IID and Dirichlet(0.5) classes, the
third-party app's CNN and fedvit's tiny ViT, on two kinds of offline images: the test app's colour blobs (every
image of a class alike: nothing to memorise) and photograph-like 1/f textures with a faint class colour (the model
fits its own images long before it generalises: see ``train acc`` against ``held-out acc``).

One client per row, as in benchmarks/label_distribution.py: SGD with momentum 0.9, lr 0.01, batch 32, from the
model's initialisation; each epoch count is a snapshot of one training run (one optimiser, every epoch
reshuffled); non-members: 2,000 images of the same generator that the client never held.

With ``--references K`` the score is the audit's default for multi-step updates (fedvit.attacks.membership: each
image's gradient against what the update holds beyond K shadow updates, the client's local training simulated on
half of 4,000 non-members, the other half scored) at the client's true class counts and momentum (the audit uses
its label estimate's), for 1,000- and 2,000-image clients over 1, 3 and 5 local epochs.

    uv run python -m benchmarks.membership_onset --workers 2   # writes docs/results/data/membership-onset.csv
    uv run python -m benchmarks.membership_onset --workers 2 --references 8   # ... membership-references.csv
    # a subset: --models cnn --sizes 1000 --out FILE.csv
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.common import ROOT, side_by_side, write_csv
from benchmarks.label_distribution import BATCH, DRAWS, LR, MOMENTUM, PARTITIONS, epochs_at, models
from fedvit.attacks.holdings import Candidates
from fedvit.attacks.membership import reference_updates, split_for_references
from fedvit.audit.membership_runs import infer
from fedvit.core.model import classify
from fedvit.observed.model_spec import head_bias
from fedvit.observed.observation import Observation
from fedvit.observed.recipe import ClientRecipe

OUT = ROOT / "docs" / "results" / "data" / "membership-onset.csv"
OUT_REFERENCES = ROOT / "docs" / "results" / "data" / "membership-references.csv"
EPOCHS, SIZES, DATA = (1, 3, 5, 10, 30, 100), (1000, 2000), ("app images", "textures")
REFERENCE_EPOCHS, REFERENCE_SIZES, REFERENCE_OTHERS = (1, 3, 5), (1000, 2000), 4000
ONSET_DRAWS = {"IID": DRAWS["IID"], "Dirichlet(0.5)": DRAWS["Dirichlet(0.5)"][:2]}


def images_of(data: str, count: int, seed: int, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    from cnnapp.task import make_images, make_textures

    return (make_images if data == "app images" else make_textures)(count, seed, alpha)


@torch.no_grad()
def accuracy(model: torch.nn.Module, images: np.ndarray, labels: np.ndarray) -> float:
    model.eval()
    predicted = classify(model, torch.as_tensor(images, dtype=torch.float32)).argmax(1).numpy()
    return float((predicted == labels).mean())


def rows(case: tuple[str, str, str, int, int], threads: int, references: int = 0) -> list[dict]:
    """One client's training; at each of :data:`EPOCHS` (with ``references``: :data:`REFERENCE_EPOCHS`) its update as
    the eavesdropper sees it, audited for membership (``threads`` torch threads: a pool's workers run side by side on
    one each)."""
    torch.set_num_threads(threads)
    name, data, partition, size, seed = case
    spec = models()[name]
    torch.manual_seed(seed)
    model = spec.build(10)
    received = {n: p.detach().numpy().copy() for n, p in model.state_dict().items()}
    images, labels = images_of(data, size, 100 + seed, PARTITIONS[partition])
    others = REFERENCE_OTHERS if references else 2000  # half of them train the shadows (the audit's split)
    candidates = Candidates((images, labels), images_of(data, others, 999, 0.0), "other images")
    if references:
        candidates, pool = split_for_references(candidates)
    skeleton = spec.build(10)
    snapshots = REFERENCE_EPOCHS if references else EPOCHS
    out = []
    for epoch in epochs_at(model, images, labels, seed, snapshots):
        sent = {n: p.detach().numpy().copy() for n, p in model.named_parameters()}
        client = ClientRecipe(size, BATCH, epoch, LR, 0.0, 0.0, 0, False, True, momentum_known=False)
        obs = Observation(update=sent, received=received, num_classes=10, spec=spec, skeleton=skeleton,
                          client=client, head_bias=head_bias(skeleton) or "")  # fmt: skip
        started = time.perf_counter()
        shadows = reference_updates(obs, pool, np.bincount(labels, minlength=10), MOMENTUM, seed, references) \
            if references else None  # fmt: skip
        member, _, _ = infer(obs, candidates, seed, shadows, pool if references else None)
        out.append({
            "model": name, "data": data, "partition": partition, "client seed": seed, "images": size,
            "local epochs": epoch, "train acc": round(accuracy(model, images, labels), 3),
            "held-out acc": round(accuracy(model, *candidates.non_members), 3),
            **({"shadow updates": len(shadows)} if shadows is not None else {}),
            "AUC": round(member.auc, 3), "null AUC (99.9th pct)": round(member.null.auc, 3),
            "TPR@0.1% FPR": member.tpr_at_0_1_percent, "null TPR@0.1%": rounded(member.null.tpr_at_0_1_percent),
            "TPR@1% FPR": member.tpr_at_1_percent, "null TPR@1%": rounded(member.null.tpr_at_1_percent),
            "FPR resolution": round(member.fpr_resolution, 4),
            "clears": member.clears_null, "membership s": round(time.perf_counter() - started, 1),
        })  # fmt: skip
        print(out[-1], flush=True)
    return out


def rounded(value: float | None) -> float | None:
    """A null figure to 4 decimals (None: below the FPR resolution)."""
    return None if value is None else round(value, 4)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=1, help="clients trained side by side, one thread each "
                        "(1: one at a time on 2 threads)")  # fmt: skip
    parser.add_argument("--references", type=int, default=0, help="shadow updates per update, scored as the "
                        "audit does by default with 8 (default 0: the loss drop)")  # fmt: skip
    parser.add_argument("--models", default="", help="comma-separated (default: all)")
    parser.add_argument("--sizes", default="", help="client images, comma-separated (default: the table's)")
    parser.add_argument("--out", type=Path, default=None, help="the CSV written (default: the table's)")
    args = parser.parse_args()
    workers, references = args.workers, args.references
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else REFERENCE_SIZES if references else SIZES
    names = args.models.split(",") if args.models else list(models())
    if unknown := sorted(set(names) - set(models())):
        parser.error(f"unknown models {unknown} (one of {', '.join(models())})")
    cases = [(name, data, partition, size, seed) for name in names for data in DATA for partition in PARTITIONS
             for size in sizes for seed in ONSET_DRAWS[partition]]  # fmt: skip
    found: list[dict] = []
    for client_rows in side_by_side(rows, cases, workers, references=references):
        found.extend(client_rows)
    write_csv(found, args.out or (OUT_REFERENCES if references else OUT))


if __name__ == "__main__":
    main()
