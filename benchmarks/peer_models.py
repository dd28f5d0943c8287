"""Peer benchmark on models that are not fedvit's: the third-party test app's CNN and a ResNet-18 at 32 px.

fedvit's attack on any model (as ``fedvit audit --model`` runs it: labels from the last linear bias, Inverting
Gradients through the user's model) against breaching 0.1.2's Inverting Gradients (its defaults; only
``max_iterations`` set), on
identical FedSGD updates of B natural photographs (``benchmarks/natural_images.py``; train split), each tool
recovering its own labels, one random start and the same number of steps each, scored by the same code
(``fedvit.audit.metrics.score``: matched PSNR/SSIM; re-identification among the true image and 99 test-split decoys).
"trained" weights: the model trained centrally on the train split (SGD; its test accuracy is reported), since the
question is what a trained model leaks, not how it was trained. The client's forward is the model in training
mode (BatchNorm on batch statistics); both attackers get the same copy, which computes that same function.

    uv run --frozen python -m benchmarks.natural_images outputs/natural-32
    uv run --frozen --group peer python -m benchmarks.peer_models --data outputs/natural-32 --models cnn \
        --steps 600 --updates 8 --variant tv=0.05 --variant tv=0.2 --variant tv=0.4 \
        --out benchmarks/results/peer-models-cnn.json
    uv run --frozen --group peer python -m benchmarks.peer_models --data outputs/natural-32 --models resnet18 \
        --steps 600 --updates 1 --variant tv=0.05 --variant tv=0.2 --variant tv=0.4 \
        --out benchmarks/results/peer-models-resnet18.json

Every ``--variant`` (``audit.*`` overrides; ``''`` = what ``fedvit audit --model`` does) attacks the same updates.
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from benchmarks.common import ROOT
from benchmarks.peer_breaching import breaching_reconstruct
from fedvit.attacks.inversion import invert
from fedvit.attacks.labels import recover_labels
from fedvit.audit.json_fields import keyed
from fedvit.audit.metrics import best_flat_image, psnr, score
from fedvit.audit.user_data import gallery_from_test_split
from fedvit.core.config import AuditConfig, parse_config
from fedvit.core.data import load_dataset
from fedvit.core.model import normalize
from fedvit.observed.model_spec import ModelSpec, head_bias, model_settings
from fedvit.observed.observation import Observation, Reconstruction, attack_model
from fedvit.observed.recipe import ClientRecipe

MODELS = {
    "cnn": ModelSpec("cnnapp.task:Net", app_dir=str(ROOT / "tests" / "thirdparty_app")),
    "resnet18": ModelSpec("resnet18", num_classes=10),
}


def observation(model: torch.nn.Module, spec: ModelSpec, gradient: dict, batch: int, seed: int) -> Observation:
    """One FedSGD gradient of ``batch`` images as ``fedvit audit --model`` observes it (``seed``: its starts)."""
    with torch.no_grad():
        classes = int(model.eval()(normalize(model, torch.zeros(2, *spec.input_shape))).shape[-1])
    return Observation(
        update=gradient,
        received={n: t.detach().numpy() for n, t in model.state_dict().items()},
        num_classes=classes,
        spec=spec,
        skeleton=model,
        client=ClientRecipe(batch, batch, 1, 0.0, 0.0, 0.0, 0, True),
        head_bias=head_bias(model) or "",
        start_seed=seed,
    )


def attack_copy(model: torch.nn.Module, spec: ModelSpec) -> torch.nn.Module:
    """The model as both attackers get it: the audit's attack copy (BatchNorm on batch statistics)."""
    return attack_model(observation(model, spec, {}, 1, 0))


def has_batchnorm(model: torch.nn.Module) -> bool:
    """A ResNet-18 at 32 px ends in 1×1 maps: training mode with one image fails in torch (a client cannot do it)."""
    return any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules())


def train_centrally(model: torch.nn.Module, data, test, epochs: int, seed: int) -> float:
    """SGD (lr 0.05, momentum 0.9, batch 32) on every train image for ``epochs``; returns the test accuracy."""
    torch.manual_seed(seed)
    x, y = data.batch(np.arange(len(data)), 32)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model.train()
    for _ in range(epochs):
        for idx in torch.randperm(len(x)).split(32):
            optimizer.zero_grad()
            F.cross_entropy(model(normalize(model, x[idx])), y[idx]).backward()
            optimizer.step()
    model.eval()
    tx, ty = test.batch(np.arange(len(test)), 32)
    with torch.no_grad():
        return float((model(normalize(model, tx)).argmax(1) == ty).float().mean())


def client_gradient(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, np.ndarray]:
    """The honest client's FedSGD update: ∇ of the mean cross-entropy, the model in training mode."""
    client = copy.deepcopy(model).train()
    client.zero_grad()
    F.cross_entropy(client(normalize(client, x)), y).backward()
    return {n: p.grad.detach().numpy().copy() for n, p in client.named_parameters()}


def breaching_invert(model: torch.nn.Module, spec: ModelSpec, gradient: dict, batch: int, steps: int,
                     seed: int) -> Reconstruction:  # fmt: skip
    """breaching 0.1.2's Inverting Gradients (its defaults, ``steps`` iterations) on one FedSGD gradient."""
    model = copy.deepcopy(model).requires_grad_(True)  # breaching differentiates with respect to the parameters
    return breaching_reconstruct(model, spec.input_shape, spec.mean, spec.std, 10, gradient, batch, steps, seed)


def variant_options(text: str) -> dict[str, float | str]:
    """``"tv=0.4,init=gaussian"`` -> AuditConfig overrides (numbers as floats); ``""`` -> what ``fedvit audit
    --model`` uses (its settings for the model, :func:`fedvit.observed.model_spec.model_settings`)."""
    options: dict[str, float | str] = {}
    for item in filter(None, text.split(",")):
        key, _, value = item.partition("=")
        try:
            options[key.strip().replace("-", "_")] = float(value)
        except ValueError:
            options[key.strip().replace("-", "_")] = value.strip()
    return options


def fedvit_invert(model: torch.nn.Module, spec: ModelSpec, gradient: dict, batch: int, steps: int,
                  seed: int, options: dict[str, float | str]) -> Reconstruction:  # fmt: skip
    """fedvit's audit of a third-party model (``fedvit audit --model``): its labels, then its optimisation."""
    obs = observation(model, spec, gradient, batch, seed)
    counts, _ = recover_labels(obs)
    options = model_settings(model)[0] | options  # fedvit audit --model's settings unless the variant sets them
    budget = AuditConfig(iterations=steps, restarts=1, max_seconds=math.inf, **options)
    images = invert(obs, budget, device="cpu")
    return Reconstruction(images.image, f"{images.note}; labels {counts.nonzero()[0].tolist()}", images.images)


def tool_name(variant: str) -> str:
    return f"fedvit {variant}".strip()


def run_cell(model, spec, train, gallery, batch: int, updates: int, steps: int, seed: int,
             variants: list[str]) -> list[dict]:  # fmt: skip
    """Each tool (every fedvit variant, then breaching) on ``updates`` FedSGD updates of ``batch`` train images."""
    rows = []
    tools = {tool_name(v): functools.partial(fedvit_invert, options=variant_options(v)) for v in variants}
    tools["breaching IG"] = breaching_invert
    rng = np.random.default_rng(seed)
    attacked = attack_copy(model, spec)
    for k in range(updates):
        idx = rng.choice(len(train), batch, replace=False)
        x, y = train.batch(idx, spec.input_shape[1])
        gradient = client_gradient(model, x, y)
        truths = x.double().numpy()
        for tool, attack in tools.items():
            start = time.perf_counter()
            rec = attack(attacked, spec, gradient, batch, steps, seed=k)
            seconds = time.perf_counter() - start
            scored = score(rec, truths, gallery)
            print(f"  update {k} {tool}: {scored.psnr:.2f} dB, re-id {scored.reid_top1:.0%}, {seconds:.0f} s "
                  f"(true labels {sorted(y.tolist())}; {rec.note[-40:]})", flush=True)  # fmt: skip
            kept = {key: keyed(scored)[key] for key in ("psnr", "ssim", "reid-top1", "reid-rank", "reid-chance")}
            kept["baseline-psnr"] = float(np.mean([psnr(best_flat_image(t), t) for t in truths]))
            rows.append({"tool": tool, "update": k, "seconds": seconds, "note": rec.note} | kept)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="an image folder (benchmarks/natural_images.py)")
    parser.add_argument("--models", default="cnn,resnet18")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--updates", type=int, default=2, help="updates per cell")
    parser.add_argument("--batch-sizes", default="1,4", help="B = 1 becomes 2 for models with BatchNorm (see below)")
    parser.add_argument("--train-epochs", type=int, default=15, help="central training of the 'trained' weights")
    parser.add_argument(
        "--variant",
        action="append",
        help="fedvit's AuditConfig overrides, e.g. "
        "'tv=0.4,init=gaussian' (repeatable; '' = its defaults, the only variant when none is given)",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "peer-models.json")
    args = parser.parse_args()
    variants = args.variant or [""]
    config = parse_config({"data.name": f"imagefolder:{args.data.resolve()}"})
    train, test = load_dataset(config.data, config.seed, "train"), load_dataset(config.data, config.seed, "test")
    gallery = gallery_from_test_split(config, 32)
    results = []
    for name in args.models.split(","):
        spec = MODELS[name]
        torch.manual_seed(0)
        random_model = spec.build(num_classes=10)
        trained = copy.deepcopy(random_model)
        accuracy = train_centrally(trained, train, test, args.train_epochs, seed=1)
        print(f"{name}: trained {args.train_epochs} epochs centrally, test accuracy {accuracy:.1%}", flush=True)
        for weights, model in (("random", random_model), ("trained", trained)):
            for batch in [int(b) for b in args.batch_sizes.split(",")]:
                if batch == 1 and has_batchnorm(model):  # torch refuses BatchNorm training on one 1x1 map
                    batch = 2
                print(f"{name}, {weights} weights, B={batch}:", flush=True)
                rows = run_cell(model, spec, train, gallery, batch, args.updates, args.steps, batch, variants)
                for tool in [*map(tool_name, variants), "breaching IG"]:
                    mine = [r for r in rows if r["tool"] == tool]
                    results.append(
                        {"model": name, "weights": weights, "batch": batch, "tool": tool, "steps": args.steps,
                         "test-accuracy": accuracy if weights == "trained" else None,
                         **{key: float(np.mean([r[key] for r in mine]))
                            for key in ("psnr", "ssim", "reid-top1", "reid-rank", "seconds", "baseline-psnr")},
                         "reid-chance": mine[0]["reid-chance"], "updates": mine}
                    )  # fmt: skip
    command = "uv run --frozen --group peer python -m benchmarks.peer_models " + " ".join(sys.argv[1:])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"command": command, "cells": results}, indent=1))
    print("| model | weights | B | tool | matched PSNR (dB) | SSIM | re-identified (chance) / mean rank "
          "| baseline (dB) | s/update |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        reid = f"{r['reid-top1']:.0%} ({r['reid-chance']:.0%}) / {r['reid-rank']:.1f}"
        print(f"| {r['model']} | {r['weights']} | {r['batch']} | {r['tool']} | {r['psnr']:.1f} | {r['ssim']:.3f} | "
              f"{reid} | {r['baseline-psnr']:.1f} | {r['seconds']:.0f} |")  # fmt: skip


if __name__ == "__main__":
    main()
