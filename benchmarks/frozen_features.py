"""Audit time of one head-only update at 224 px: the frozen backbone's features computed once
(fedvit.attacks.frozen_features) against the whole model run in every simulation, shadow and score.

A client fine-tunes the head of timm's ViT-Ti/16 at 224 px (random weights, seeded, stand in for the public
pretrained backbone) on its frozen backbone: 1 local epoch over 200 photograph-like textures upsampled to 224 px,
SGD lr 0.05, momentum 0.9, batch 32. The eavesdropper holds 300 other images (auxiliary data and non-members) and
runs the audit's label-count and membership measures (3 shadow updates) on the update, once on cached features and
once with the cache switched off; the figures of both must agree.

    uv run python -m benchmarks.frozen_features   # writes docs/results/data/frozen-features.csv
"""

from __future__ import annotations

import sys
import time

import numpy as np
import timm
import torch
import torch.nn.functional as F

from benchmarks.common import ROOT, write_csv
from fedvit.attacks.holdings import Auxiliary, Candidates
from fedvit.audit import registry
from fedvit.audit.registry import Held, MeasureOptions, evidence, measure_all
from fedvit.core.budget import AuditConfig
from fedvit.core.model import classify
from fedvit.observed.model_spec import ModelSpec
from fedvit.observed.observation import Observation
from fedvit.observed.recipe import ClientRecipe

OUT = ROOT / "docs" / "results" / "data" / "frozen-features.csv"
MODEL, SIZE, OTHERS, BATCH, LR, MOMENTUM, REFERENCES = "vit_tiny_patch16_224", 200, 300, 32, 0.05, 0.9, 3


def upsampled(count: int, seed: int, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    sys.path.insert(0, str(ROOT / "tests" / "thirdparty_app"))  # the test app's image generators
    from cnnapp.task import make_textures

    images, labels = make_textures(count, seed, alpha)
    big = F.interpolate(torch.as_tensor(images, dtype=torch.float32), size=224, mode="bilinear")
    return big.clamp(0, 1).numpy(), labels


def build() -> torch.nn.Module:
    torch.manual_seed(0)  # the public backbone: the same weights in every build
    return timm.create_model(MODEL, pretrained=False, num_classes=10)


def head_update() -> tuple[Observation, Auxiliary, Candidates]:
    spec = ModelSpec(MODEL, input_shape=(3, 224, 224), builder=build)
    model = spec.build()
    received = {n: t.detach().numpy().copy() for n, t in model.state_dict().items()}
    images, labels = upsampled(SIZE, 100, 0.5)
    others = upsampled(OTHERS, 999, 0.0)
    model.requires_grad_(False).head.requires_grad_(True)
    optimiser = torch.optim.SGD(model.head.parameters(), lr=LR, momentum=MOMENTUM)
    order = torch.randperm(SIZE, generator=torch.Generator().manual_seed(1))
    for first in range(0, SIZE, BATCH):
        batch = order[first : first + BATCH]
        loss = F.cross_entropy(classify(model, torch.as_tensor(images[batch])), torch.as_tensor(labels[batch]))
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    sent = {n: p.detach().numpy().copy() for n, p in model.named_parameters()}
    client = ClientRecipe(SIZE, BATCH, 1, LR, MOMENTUM, 0.0, 0, False, True)
    obs = Observation(update=sent, received=received, num_classes=10, spec=spec, skeleton=spec.build(),
                      client=client, head_bias="head.bias", trained=("head.weight", "head.bias"))  # fmt: skip
    return obs, Auxiliary(*others, "other images"), Candidates((images, labels), others, "other images")


def audited(obs: Observation, aux: Auxiliary, candidates: Candidates) -> tuple[float, dict]:
    started = time.perf_counter()
    held = Held(None, None, None, False, AuditConfig(), {}, aux, candidates, MeasureOptions(references=REFERENCES))
    measured = measure_all(obs, held)
    found = evidence(measured).leakage
    return time.perf_counter() - started, {**found, "counts": measured.findings[registry.LABELS].rows[0]["labels"],
                                            "frozen-features": measured.held.features.note}  # fmt: skip


def main() -> None:
    torch.set_num_threads(2)
    obs, aux, candidates = head_update()
    on_features = registry.on_features
    rows, figures = [], []
    for cached in (True, False):
        registry.on_features = on_features if cached else (lambda *args: "switched off")
        seconds, found = audited(obs, aux, candidates)
        membership = found["membership"].figures
        figures.append((found["counts"], {k: v.auc for k, v in membership.scores.items()}))
        print(f"cached={cached}: {seconds:.1f} s; {found['frozen-features']}", flush=True)
        rows.append({"model": MODEL, "px": 224, "images": SIZE, "other images": OTHERS,
                     "shadow updates": REFERENCES, "frozen features": "cached once" if cached else "whole model",
                     "seconds": round(seconds, 1), "membership AUC": round(membership.auc, 3),
                     "label counts": found["counts"]})  # fmt: skip
    registry.on_features = on_features
    same_labels = figures[0][0] == figures[1][0]
    same_aucs = all(abs(figures[0][1][k] - figures[1][1][k]) < 1e-6 for k in figures[0][1])
    for row in rows:
        row["speed-up"] = round(rows[1]["seconds"] / rows[0]["seconds"], 1)
        row["figures agree"] = same_labels and same_aucs
    write_csv(rows, OUT)


if __name__ == "__main__":
    main()
