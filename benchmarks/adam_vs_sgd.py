"""Label counts and membership of an Adam client against an SGD client, at 1 and 3 local epochs.

One client's update per row: the third-party app's CNN from its initialisation, 1,000 of the app's images (IID, or
one of two Dirichlet(0.5) class mixes), batch 32, trained with SGD (lr 0.01, momentum 0.9) or Adam (lr 0.001,
torch's defaults); the optimiser, lr and momentum are on record, as an app that names them in its run config. The
eavesdropper holds 2,000 other images of the same generator (auxiliary data and non-members) and runs the audit's
label-count and membership measures (3 shadow updates, trained with the client's optimiser) with the power twin.
The label counts' relation is SGD's update: for Adam the audit marks them unverified, and this table says how far
off they are.

    uv run python -m benchmarks.adam_vs_sgd --workers 2   # writes docs/results/data/adam-vs-sgd.csv
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
import torch.nn.functional as F

from benchmarks.common import ROOT, side_by_side, write_csv
from benchmarks.label_distribution import BATCH, PARTITIONS, models
from fedvit.attacks.holdings import Auxiliary, Candidates
from fedvit.attacks.label_distribution import prior_accuracy
from fedvit.attacks.labels import label_accuracy
from fedvit.audit.registry import LABELS, Held, MeasureOptions, evidence, measure_all
from fedvit.core.budget import AuditConfig
from fedvit.core.model import classify
from fedvit.observed.model_spec import head_bias
from fedvit.observed.observation import Observation
from fedvit.observed.recipe import ClientRecipe

OUT = ROOT / "docs" / "results" / "data" / "adam-vs-sgd.csv"
OPTIMISERS = {"sgd": (0.01, 0.9), "adam": (0.001, 0.0)}  # lr, SGD momentum
EPOCHS, SIZE, OTHERS, REFERENCES = (1, 3), 1000, 2000, 3
DRAWS = {"IID": (0,), "Dirichlet(0.5)": (0, 1)}


def trained(optimiser: str, epochs: int, partition: str, seed: int) -> tuple[Observation, tuple, tuple]:
    from cnnapp.task import make_images

    spec = models()["cnn"]
    torch.manual_seed(seed)
    model = spec.build(10)
    received = {n: p.detach().numpy().copy() for n, p in model.state_dict().items()}
    images, labels = make_images(SIZE, 100 + seed, PARTITIONS[partition])
    others = make_images(OTHERS, 999)
    lr, momentum = OPTIMISERS[optimiser]
    step = (torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum) if optimiser == "sgd"
            else torch.optim.Adam(model.parameters(), lr=lr))  # fmt: skip
    generator = torch.Generator().manual_seed(seed)
    x, y = torch.as_tensor(images, dtype=torch.float32), torch.as_tensor(labels)
    for _ in range(epochs):
        order = torch.randperm(SIZE, generator=generator)
        for first in range(0, SIZE, BATCH):
            batch = order[first : first + BATCH]
            step.zero_grad()
            F.cross_entropy(classify(model, x[batch]), y[batch]).backward()
            step.step()
    sent = {n: p.detach().numpy().copy() for n, p in model.named_parameters()}
    client = ClientRecipe(SIZE, BATCH, epochs, lr, momentum, 0.0, 0, False, True, optimiser=optimiser)
    skeleton = spec.build(10)
    obs = Observation(update=sent, received=received, num_classes=10, spec=spec, skeleton=skeleton,
                      client=client, head_bias=head_bias(skeleton) or "")  # fmt: skip
    return obs, (images, labels), others


def row(case: tuple[str, int, str, int], threads: int) -> dict:
    torch.set_num_threads(threads)
    optimiser, epochs, partition, seed = case
    obs, (images, labels), others = trained(optimiser, epochs, partition, seed)
    aux = Auxiliary(*others, "2,000 other images")
    held = Held(images, labels, None, True, AuditConfig(), {}, aux, Candidates((images, labels), others, "other"),
                MeasureOptions(references=REFERENCES))  # fmt: skip
    measured = measure_all(obs, held)
    findings, found = measured.findings, evidence(measured).leakage
    counts = findings[LABELS].rows[0]["labels"] or {}
    membership, power = found["membership"].figures, found["membership"].power
    return {
        "optimiser": optimiser, "local epochs": epochs, "partition": partition, "client seed": seed, "images": SIZE,
        "label error": round(1 - label_accuracy(np.array([counts.get(k, 0) for k in range(10)]), labels), 4),
        "prior error": round(1 - prior_accuracy(aux.prior(10), labels), 4),
        "membership AUC": round(membership.auc, 3), "membership null AUC": round(membership.null.auc, 3),
        "strongest score": membership.score, "clears null": found["membership"].clears,
        "simulated AUC (power)": None if power is None or power.simulated is None else round(power.simulated.auc, 3),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=1, help="rows run side by side, one thread each")
    workers = parser.parse_args().workers
    cases = [(o, e, p, s) for o in OPTIMISERS for e in EPOCHS for p in PARTITIONS for s in DRAWS[p]]
    rows = []
    for result in side_by_side(row, cases, workers):
        rows.append(result)
        print(result, flush=True)
    write_csv(rows, OUT)


if __name__ == "__main__":
    main()
