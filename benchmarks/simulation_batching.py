"""Batched simulations: do ten independent simulated local trainings run sooner as one vectorised computation?

The label estimate's class-mix search runs, per Gauss–Newton step, one simulation per class (its finite
differences), each independent of the others, with the same batch sizes and step count: they could run as one
``torch.func.vmap`` over stacked weights and images. Here ten trainings of the same shape (SGD, momentum 0.9, one
epoch of 1,856 images in batches of 32, 58 steps; and a head-only case, ``Linear(768, 10)`` on banked features, 64
images in 2 steps, the ViT-B/16 audit's) are timed three ways on 2 cores: one after another on 2 threads, two at a
time on one thread each (the audit's ``side_by_side``) and as one vmap over the ten (2 threads). Median of
``--repeats``, after one warm-up each; nothing else should run beside it.

    uv run --frozen python -m benchmarks.simulation_batching --repeats 5   # docs/results/data/simulation-batching.csv
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.common import ROOT, write_csv
from fedvit.attacks.label_distribution import side_by_side
from fedvit.attacks.local_sgd import sgd_step

sys.path.insert(0, str(ROOT / "tests" / "flower_idioms" / "quickstart"))
from qsapp.task import Net  # noqa: E402  Flower's quickstart CNN, as its authors write it (x.view)

OUT = ROOT / "docs" / "results" / "data" / "simulation-batching.csv"
RUNS, LR, MOMENTUM = 10, 0.01, 0.9
CASES: dict[str, tuple[Callable[[], nn.Module], tuple[int, ...], int, int]] = {  # model, input, images, batch
    "quickstart CNN, 1,856 images, 58 steps": (Net, (3, 32, 32), 1856, 32),
    "ViT-B/16 head on features, 64 images, 2 steps": (lambda: nn.Linear(768, 10), (768,), 64, 32),
}


def step(w: dict, loss: torch.Tensor, velocity: dict) -> tuple[dict, dict]:
    """The audit's SGD step (``fedvit.attacks.local_sgd.sgd_step``) on ``loss``'s gradients."""
    grads = dict(zip(w, torch.autograd.grad(loss, list(w.values())), strict=True))
    with torch.no_grad():
        w, velocity = sgd_step(w, grads, velocity, LR, MOMENTUM)
    return {n: t.requires_grad_(True) for n, t in w.items()}, velocity


def one_training(model: nn.Module, weights: dict, x: torch.Tensor, y: torch.Tensor, batch: int) -> dict:
    """SGD with momentum over the batches of (x, y) from ``weights``: the simulation's inner loop."""
    w = {n: p.clone().requires_grad_(True) for n, p in weights.items()}
    velocity: dict = {}
    for first in range(0, len(y), batch):
        part = slice(first, first + batch)
        loss = F.cross_entropy(torch.func.functional_call(model, w, (x[part],)), y[part])
        w, velocity = step(w, loss, velocity)
    return w


def batched_training(model: nn.Module, weights: dict, xs: torch.Tensor, ys: torch.Tensor, batch: int) -> dict:
    """The same for ``RUNS`` trainings at once: the weights stacked, the forward vmapped over them."""
    w = {n: p.expand(RUNS, *p.shape).clone().requires_grad_(True) for n, p in weights.items()}
    forward = torch.func.vmap(lambda ww, x: torch.func.functional_call(model, ww, (x,)))
    velocity: dict = {}
    for first in range(0, ys.shape[1], batch):
        logits = forward(w, xs[:, first : first + batch])
        y = ys[:, first : first + batch]
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="sum") / y.shape[1]
        w, velocity = step(w, loss, velocity)
    return w


def timed(fn: Callable[[], object], repeats: int) -> float:
    fn()
    found = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        found.append(time.perf_counter() - started)
    return statistics.median(found)


def case_rows(name: str, build: Callable[[], nn.Module], shape: tuple[int, ...], images: int, batch: int,
              repeats: int) -> list[dict]:  # fmt: skip
    """The three ways timed on one case (and whether the vmapped training gives a run's own weights)."""
    torch.manual_seed(0)
    model = build()
    weights = {n: p.detach() for n, p in model.named_parameters()}
    xs, ys = torch.rand(RUNS, images, *shape), torch.randint(0, 10, (RUNS, images))
    check, alone = batched_training(model, weights, xs, ys, batch), one_training(model, weights, xs[3], ys[3], batch)
    agree = all(torch.allclose(check[n][3], alone[n], atol=1e-5) for n in alone)
    # a model per run, as each simulation builds its own (functional_call swaps a module's parameters in place)
    run = lambda k: one_training(copy.deepcopy(model), weights, xs[k], ys[k], batch)  # noqa: E731
    ways = {
        "one after another, 2 threads": lambda: [run(k) for k in range(RUNS)],
        "two at a time, 1 thread each": lambda: side_by_side(run, list(range(RUNS))),
        "one vmap over the ten, 2 threads": lambda: batched_training(model, weights, xs, ys, batch),
    }
    seconds = {way: timed(fn, repeats) for way, fn in ways.items()}
    base = seconds["two at a time, 1 thread each"]
    return [{"case": name, "way": way, "seconds for ten": round(s, 3), "vs the audit's (two at a time)":
             round(base / s, 2), "vmap agrees": agree} for way, s in seconds.items()]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    repeats = parser.parse_args().repeats
    torch.set_num_threads(2)
    rows = []
    for name, case in CASES.items():
        rows += case_rows(name, *case, repeats)
        for row in rows[-3:]:
            print(row, flush=True)
    write_csv(rows, OUT)


if __name__ == "__main__":
    main()
