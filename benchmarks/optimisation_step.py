"""Milliseconds per Adam step of the optimisation attack, fedvit against breaching 0.1.2's Inverting Gradients.

One FedSGD update of B random images per model (random init), each tool attacking it for --steps steps after a
3-step warm-up, in this process one after the other (nothing else should run beside it: the 2 cores are shared).
fedvit runs as ``fedvit audit --model`` runs it (labels, then ``fedvit.attacks.inversion.optimise``, the loop the ViT
audit uses too), breaching with its defaults, both as ``benchmarks/peer_models.py`` calls them (the same model
copy; the reconstructions themselves are compared there).

    uv run --frozen --group peer python -m benchmarks.optimisation_step --steps 40
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from benchmarks.common import ROOT
from benchmarks.peer_models import attack_copy, breaching_invert, fedvit_invert
from fedvit.audit.fedvit_run import fedvit_spec as fedvit_model_spec
from fedvit.core.config import parse_config
from fedvit.core.model import normalize
from fedvit.observed.model_spec import ModelSpec

VIT_S16_32PX = {
    "model.name": "vit_small_patch16_224",
    "model.img-size": 32,
    "model.patch-size": 16,
    "model.embed-dim": 0,
    "model.depth": 0,
    "model.num-heads": 0,
}
MODELS: dict[str, Callable[[], ModelSpec]] = {
    "tiny ViT (default, 32 px)": lambda: fedvit_model_spec(parse_config({}), 10),
    "ViT-S/16 32 px": lambda: fedvit_model_spec(parse_config(VIT_S16_32PX), 10),
    "test app's CNN": lambda: ModelSpec("cnnapp.task:Net", app_dir=str(ROOT / "tests" / "thirdparty_app")),
    "ResNet-18 32 px": lambda: ModelSpec("resnet18", num_classes=10),
}


def per_step(attack: Callable[[int], object], steps: int) -> float:
    """Milliseconds per step of ``attack(steps)`` after a 3-step warm-up."""
    attack(3)
    start = time.perf_counter()
    attack(steps)
    return (time.perf_counter() - start) / steps * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch", type=int, default=4)
    args = parser.parse_args()
    print("command: uv run --frozen --group peer python -m benchmarks.optimisation_step " + " ".join(sys.argv[1:]))
    print(f"torch threads {torch.get_num_threads()}, B = {args.batch}, {args.steps} steps per tool")
    for label, make_spec in MODELS.items():
        torch.manual_seed(0)
        spec = make_spec()
        model = spec.build(num_classes=10).train()
        x, y = torch.rand(args.batch, *spec.input_shape), torch.arange(args.batch) % 10
        F.cross_entropy(model(normalize(model, x)), y).backward()
        gradient = {n: p.grad.numpy().copy() for n, p in model.named_parameters()}
        attacked = attack_copy(model, spec)
        common = dict(model=attacked, spec=spec, gradient=gradient, batch=args.batch, seed=0)
        ours = per_step(lambda steps: fedvit_invert(steps=steps, options={}, **common), args.steps)  # noqa: B023
        theirs = per_step(lambda steps: breaching_invert(steps=steps, **common), args.steps)  # noqa: B023
        print(f"{label:28s} fedvit {ours:8.1f} ms/step, breaching IG {theirs:8.1f} ms/step, ratio {ours / theirs:.2f}")


if __name__ == "__main__":
    main()
