"""``fedvit robustness-check <run>``: sanity checks of a run's robust accuracy (Carlini et al. 2019, "On
Evaluating Adversarial Robustness", Sec. 5), on the final global model and a seeded class-stratified sample of the
central test set. Each check says pass or fail with its numbers; the report goes to ``<run>/robustness-check.md``
and ``.json``.

1. AutoAttack (standard) robust accuracy <= the run's PGD (``robust.*``) on the same images.
2. Robust accuracy falls to ~0 as ε grows (8, 16, 32, 64 / 255; PGD with 5x the run's steps, α = ε/4):
   non-increasing in ε, and <= 5% at the largest.
3. A much stronger PGD (10x steps, 5 restarts) is not meaningfully stronger than AutoAttack (by <= 2 points):
   otherwise AutoAttack is not the worst case here.
4. The gradient-free Square attack alone is not meaningfully stronger than the gradient attacks (by <= 2 points):
   a black-box attack beating white-box ones is the classic sign of masked gradients.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from safetensors.numpy import load_file

from fedvit.clients.adversarial import PGD, robust_correct, torch_generator
from fedvit.clients.autoattack import SQUARE_QUERIES, autoattack_correct
from fedvit.core.config import Config, parse_config
from fedvit.core.data import ImageSet, load_dataset, stratified_subset
from fedvit.core.model import build_model, classify, resolve_device, set_weights
from fedvit.core.results import atomic_write

EPS_SWEEP_255 = (8.0, 16.0, 32.0, 64.0)
LARGE_EPS_MAX_ACCURACY = 0.05
TOLERANCE = 0.02  # two points: "meaningfully" in checks 3 and 4


def load_run(run_dir: Path) -> tuple[Config, torch.nn.Module, ImageSet]:
    """The run's config, its final global model (``model.safetensors``) and its central test set."""
    for name in ("config.json", "model.safetensors"):
        if not (run_dir / name).is_file():
            raise FileNotFoundError(f"{run_dir / name} is missing: give the folder of a finished fedvit run")
    config = parse_config(json.loads((run_dir / "config.json").read_text()))
    test = load_dataset(config.data, config.seed, "test")
    model = build_model(config.model, test.num_classes, seed=config.seed).to(resolve_device(config.device))
    weights = {k: v for k, v in load_file(str(run_dir / "model.safetensors")).items() if not k.startswith("strategy/")}
    set_weights(model, weights)
    return config, model.eval(), test


def _accuracy(correct: torch.Tensor) -> float:
    return float(correct.float().mean().item())


def run_checks(run_dir: Path, samples: int = 100, square_queries: int = SQUARE_QUERIES, log=print) -> dict:
    """Every check on ``samples`` test images; returns the report (also written next to the run).
    ``square_queries`` (AutoAttack's 5000 by default) bounds Square in AutoAttack and alone."""
    config, model, test = load_run(run_dir)
    indices = stratified_subset(test.labels, np.arange(len(test)), samples, config.seed)
    device = next(model.parameters()).device
    img_size = int(model.patch_embed.img_size[0])
    x, y = (t.to(device) for t in test.batch(indices, img_size))
    robust = config.robust
    eps = robust.eps_255 / 255
    pgd = PGD(eps=eps, alpha=robust.alpha_255 / 255, steps=robust.steps, restarts=robust.restarts)

    def timed(name: str, fn) -> float:
        start = time.perf_counter()
        value = _accuracy(fn())
        log(f"  {name}: {100 * value:.1f}% ({time.perf_counter() - start:.1f} s)")
        return value

    log(f"robustness check of {run_dir} on {len(indices)} test images, ε = {robust.eps_255:g}/255")
    with torch.no_grad():
        natural = _accuracy(classify(model, x).argmax(1) == y)
    acc = {"natural": natural}
    acc["pgd"] = timed(f"PGD {pgd.steps} steps x {pgd.restarts}", lambda: robust_correct(model, x, y, pgd, _gen(1)))
    acc["autoattack"] = timed(
        "AutoAttack standard",
        lambda: autoattack_correct(model, x, y, test.num_classes, eps, "standard", config.seed, square_queries),
    )
    strong = replace(pgd, steps=10 * pgd.steps, restarts=5)
    acc["pgd-strong"] = timed(
        f"PGD {strong.steps} steps x {strong.restarts}", lambda: robust_correct(model, x, y, strong, _gen(2))
    )
    acc["square"] = timed(
        "Square alone",
        lambda: autoattack_correct(model, x, y, test.num_classes, eps, "square", config.seed, square_queries),
    )
    sweep = {}
    for eps_255 in EPS_SWEEP_255:
        attack = PGD(eps=eps_255 / 255, alpha=eps_255 / 255 / 4, steps=5 * pgd.steps)
        sweep[eps_255] = timed(f"PGD ε {eps_255:g}/255", lambda a=attack: robust_correct(model, x, y, a, _gen(3)))
    gradient_best = min(acc["pgd"], acc["autoattack"], acc["pgd-strong"])
    values = [sweep[e] for e in EPS_SWEEP_255]
    checks = [
        _check("AutoAttack <= PGD", acc["autoattack"] <= acc["pgd"],
               f"AutoAttack {_pct(acc['autoattack'])} vs PGD {_pct(acc['pgd'])}"),
        _check("robust accuracy -> 0 as ε grows",
               all(b <= a for a, b in zip(values, values[1:], strict=False)) and values[-1] <= LARGE_EPS_MAX_ACCURACY,
               ", ".join(f"{e:g}/255: {_pct(v)}" for e, v in sweep.items())
               + f" (non-increasing, <= {_pct(LARGE_EPS_MAX_ACCURACY)} at {EPS_SWEEP_255[-1]:g}/255)"),
        _check("stronger PGD does not beat AutoAttack", acc["pgd-strong"] >= acc["autoattack"] - TOLERANCE,
               f"PGD {strong.steps}x{strong.restarts} {_pct(acc['pgd-strong'])} vs AutoAttack "
               f"{_pct(acc['autoattack'])} (tolerance {_pct(TOLERANCE)})"),
        _check("gradient-free Square does not beat gradient attacks", acc["square"] >= gradient_best - TOLERANCE,
               f"Square {_pct(acc['square'])} vs best gradient attack {_pct(gradient_best)} "
               f"(tolerance {_pct(TOLERANCE)})"),
    ]  # fmt: skip
    report = {
        "run": str(run_dir),
        "samples": len(indices),
        "eps-255": robust.eps_255,
        "square-queries": square_queries,
        "accuracy": acc,
        "eps-sweep": {f"{e:g}": v for e, v in sweep.items()},
        "checks": checks,
        "passed": all(c["passed"] for c in checks),
    }
    atomic_write(run_dir / "robustness-check.json", json.dumps(report, indent=1).encode())
    atomic_write(run_dir / "robustness-check.md", markdown(report).encode())
    return report


def _gen(stream: int) -> torch.Generator:
    return torch_generator([stream, 0x0A11], torch.device("cpu"))


def _pct(value: float) -> str:
    return f"{100 * value:.1f}%"


def _check(name: str, passed: bool, numbers: str) -> dict:
    return {"check": name, "passed": bool(passed), "numbers": numbers}


def markdown(report: dict) -> str:
    acc = report["accuracy"]
    lines = [
        f"# Robustness sanity checks: {report['run']}",
        "",
        f"{report['samples']} central test images, L∞ ε = {report['eps-255']:g}/255, Square with "
        f"{report['square-queries']} queries. Natural accuracy "
        f"{_pct(acc['natural'])}; robust accuracy: PGD {_pct(acc['pgd'])}, AutoAttack {_pct(acc['autoattack'])}, "
        f"strong PGD {_pct(acc['pgd-strong'])}, Square alone {_pct(acc['square'])}.",
        "",
        "| check | verdict | numbers |",
        "|---|---|---|",
        *(f"| {c['check']} | {'pass' if c['passed'] else '**FAIL**'} | {c['numbers']} |" for c in report["checks"]),
        "",
    ]
    return "\n".join(lines)
