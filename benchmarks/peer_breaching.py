"""Peer benchmark: fedvit's optimisation attack against breaching's Inverting Gradients on identical updates.

Both attack the same FedSGD updates (made by fedvit's real client code, ``fedvit.audit.benchmark``), each recovers the
labels itself (fedvit: ``fedvit.attacks.labels``; breaching: its default "bias-corrected" strategy), both start from
random images and take the same number of optimiser steps with one restart, and both are scored by the same code
(``fedvit.audit.pipeline.score``: matched PSNR/SSIM and re-identification among test-split decoys). breaching 0.1.2 runs
with its own Inverting Gradients defaults (cosine objective, signed Adam step 0.1 on normalised pixels with its
step decay, TV 0.2, box constraint, best total objective kept); only ``max_iterations`` is set. Nothing here
downloads weights: breaching's LPIPS metric is never called. breaching lives in the ``peer`` dependency group:

    uv run --frozen python -m benchmarks.natural_images outputs/natural-32
    uv run --frozen fedvit run -c "run-name='natural-trained' data.name='imagefolder:$PWD/outputs/natural-32'"
    uv run --frozen --group peer python -m benchmarks.peer_breaching --data outputs/natural-32 \\
        --trained outputs/natural-trained --steps 600 --updates 2
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from benchmarks.common import ROOT  # noqa: F401  (puts the checkout first on sys.path)
from fedvit.attacks.inversion import attack_model, invert  # noqa: E402
from fedvit.attacks.reidentification import Gallery  # noqa: E402
from fedvit.audit.benchmark import (  # noqa: E402
    DEFENCES,
    Setting,
    client_update_and_labels,
    defence_config,
    partitions,
)
from fedvit.audit.json_fields import keyed  # noqa: E402
from fedvit.audit.metrics import score  # noqa: E402
from fedvit.audit.user_data import gallery_from_test_split  # noqa: E402
from fedvit.core.budget import AuditConfig  # noqa: E402
from fedvit.core.config import Config, parse_config  # noqa: E402
from fedvit.core.results import trained_model  # noqa: E402
from fedvit.observed.observation import Observation, Reconstruction, as_gradient, image_geometry  # noqa: E402


def breaching_invert(obs: Observation, steps: int, seed: int) -> Reconstruction:
    """breaching 0.1.2's Inverting Gradients (its defaults, ``steps`` iterations) on a FedSGD update."""
    model = attack_model(obs)  # the received weights, explicit attention path (double backward on CPU)
    pretrained = getattr(model, "pretrained_cfg", {}) or {}
    c, h, w, _ = image_geometry(obs)
    mean, std = pretrained.get("mean", (0.5, 0.5, 0.5)), pretrained.get("std", (0.5, 0.5, 0.5))
    gradient = as_gradient(obs).update
    return breaching_reconstruct(model, (c, h, w), mean, std, obs.num_classes, gradient, obs.meta["batch-size"],
                                 steps, seed)  # fmt: skip


def breaching_reconstruct(
    model: torch.nn.Module,
    shape: tuple[int, int, int],
    mean: tuple[float, ...],
    std: tuple[float, ...],
    classes: int,
    gradient: dict[str, np.ndarray],
    batch: int,
    steps: int,
    seed: int,
    local: dict | None = None,
) -> Reconstruction:
    """breaching's Inverting Gradients on one FedSGD ``gradient`` (by parameter name) of ``model``, whose
    parameters must require grad; images in [0, 1]. ``local``: breaching's multi-step user instead (its
    ``local_hyperparams``: ``lr``, ``steps``, ``data_per_step`` and the true ``labels`` of every step, plus
    ``all_labels``; ``gradient`` is then w_sent − w_received)."""
    import breaching

    logging.getLogger("breaching").setLevel(logging.WARNING)
    cfg = breaching.get_attack_config(
        "invertinggradients", overrides=[f"optim.max_iterations={steps}", f"optim.callback={10 * steps}"]
    )
    metadata = SimpleNamespace(shape=shape, mean=mean, std=std, modality="vision", classes=classes)
    names = [n for n, _ in model.named_parameters()]
    payload = [{"parameters": [p.detach() for p in model.parameters()], "buffers": None, "metadata": metadata}]
    shared = [
        {
            "gradients": [torch.as_tensor(gradient[n], dtype=torch.float32) for n in names],
            "buffers": None,
            "metadata": {
                "num_data_points": batch,
                "labels": None if local is None else local.pop("all_labels"),
                "local_hyperparams": local,
            },  # fmt: skip
        }
    ]
    attacker = breaching.attacks.prepare_attack(model, torch.nn.CrossEntropyLoss(), cfg)
    torch.manual_seed(seed)
    out, _ = attacker.reconstruct(payload, shared, {}, dryrun=False)
    images = out["data"] * torch.as_tensor(std).view(1, -1, 1, 1) + torch.as_tensor(mean).view(1, -1, 1, 1)
    images = images.clamp(0, 1).double().numpy()
    return Reconstruction(images[0], f"breaching IG, labels {out['labels'].tolist()}", images=tuple(images))


def fedvit_invert(obs: Observation, steps: int, budget: AuditConfig) -> Reconstruction:
    """fedvit's optimisation attack with its configured audit.* settings, ``steps`` Adam steps, one random start."""
    audit = dataclasses.replace(budget, iterations=steps, restarts=1, max_seconds=math.inf, closed_form_start=False)
    return invert(obs, audit)


def plain_updates(
    base: Config, setting: Setting, updates: int, out: Path
) -> tuple[list[tuple[Observation, np.ndarray, np.ndarray]], Gallery]:
    """``updates`` plain FedSGD client updates of ``setting`` (observation, true images, true labels) and the
    re-identification gallery of the data's test split."""
    config = defence_config(base, DEFENCES["plain"], updates, out, setting)
    count = partitions(config, setting, updates)
    made = [client_update_and_labels(config, k, count, seed_key=1000) for k in range(updates)]
    for obs, _, _ in made:
        obs.meta["batch-size"] = setting.batch
    return made, gallery_from_test_split(config, config.model.img_size)


def scored_row(tool: str, k: int, rec: Reconstruction, truths: np.ndarray, gallery: Gallery, seconds: float) -> dict:
    """One attack's result on update ``k``, scored by the audit's own code."""
    scored = score(rec, truths, gallery)
    print(f"  update {k} {tool}: {scored.psnr:.2f} dB, re-id {scored.reid_top1:.0%}, {seconds:.0f} s", flush=True)
    return {"tool": tool, "update": k, "seconds": seconds, "note": rec.note} | {
        key: keyed(scored)[key] for key in ("psnr", "ssim", "reid-top1", "reid-rank", "reid-chance")
    }


def cell(base: Config, setting: Setting, updates: int, steps: int, out: Path) -> tuple[list[dict], float]:
    """Both attacks on ``updates`` plain FedSGD updates of ``setting``: one scored row per attack and update, and
    the no-information baseline of those updates."""
    made, gallery = plain_updates(base, setting, updates, out)
    rows = []
    for k, (obs, truths, _) in enumerate(made):
        for tool in ("fedvit", "breaching IG"):
            start = time.perf_counter()
            rec = fedvit_invert(obs, steps, base.audit) if tool == "fedvit" else breaching_invert(obs, steps, seed=k)
            rows.append(scored_row(tool, k, rec, truths, gallery, time.perf_counter() - start))
    return rows, baseline_psnr(made)


def baseline_psnr(made: list[tuple[Observation, np.ndarray, np.ndarray]]) -> float:
    """Mean PSNR of the best flat image over the true images of ``made``."""
    from fedvit.audit.metrics import best_flat_image, psnr

    return float(np.mean([psnr(best_flat_image(t), t) for _, truths, _ in made for t in np.asarray(truths, float)]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="an image folder (benchmarks/natural_images.py)")
    parser.add_argument("--trained", type=Path, help="a finished run whose final model is the trained weights")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--updates", type=int, default=2, help="updates per cell")
    parser.add_argument("--batch-sizes", default="1,4")
    parser.add_argument("-c", "--config", action="append", default=[], help="key=value (fedvit's audit.* etc.)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "peer-breaching.json")
    args = parser.parse_args()
    overrides = {"data.name": f"imagefolder:{args.data.resolve()}"}
    for item in args.config:
        key, value = item.split("=", 1)
        overrides[key] = json.loads(value) if value[:1] in '0123456789-[{tf"' else value
    base = parse_config(overrides)
    weights = {"random": base} | ({"trained": trained_model(base, args.trained)} if args.trained else {})
    results = []
    work = Path("/tmp/fedvit-peer")
    for name, config in weights.items():
        for batch in [int(b) for b in args.batch_sizes.split(",")]:
            print(f"{name} weights, B={batch}:", flush=True)
            rows, baseline = cell(config, Setting(batch), args.updates, args.steps, work)
            for tool in ("fedvit", "breaching IG"):
                mine = [r for r in rows if r["tool"] == tool]
                results.append(
                    {"weights": name, "batch": batch, "tool": tool, "steps": args.steps,
                     "psnr": float(np.mean([r["psnr"] for r in mine])),
                     "ssim": float(np.mean([r["ssim"] for r in mine])),
                     "reid-top1": float(np.mean([r["reid-top1"] for r in mine])),
                     "reid-rank": float(np.mean([r["reid-rank"] for r in mine])),
                     "reid-chance": mine[0]["reid-chance"], "baseline-psnr": baseline,
                     "seconds": float(np.mean([r["seconds"] for r in mine])), "updates": mine}
                )  # fmt: skip
    command = "uv run --frozen --group peer python -m benchmarks.peer_breaching " + " ".join(sys.argv[1:])
    report = {"command": command, "fedvit attack": base.audit.describe(), "cells": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    print(
        "| weights | B | tool | matched PSNR (dB) | SSIM | re-identified (chance) / mean rank | baseline (dB) "
        "| s/update |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['weights']} | {r['batch']} | {r['tool']} | {r['psnr']:.1f} | {r['ssim']:.3f} | "
              f"{r['reid-top1']:.0%} ({r['reid-chance']:.0%}) / {r['reid-rank']:.1f} | {r['baseline-psnr']:.1f} | "
              f"{r['seconds']:.0f} |")  # fmt: skip


if __name__ == "__main__":
    main()
