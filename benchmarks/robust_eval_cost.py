"""Cost of robust evaluation per image: the run's PGD (``robust.*``: 10 steps, 1 restart) vs AutoAttack
(``fedvit.clients.autoattack``: ``apgd`` and ``standard``), at ε = 8/255 on the same test images.

AutoAttack attacks only what is still classified correctly, so its cost depends on the model: measured on the
tiny ViT (32 px) after a few epochs of natural training on fedvit's synthetic data (clean accuracy well above
chance), where many images survive PGD and AutoAttack has to work for them. Prints a Markdown table.

Usage: uv run --frozen python benchmarks/robust_eval_cost.py [--images 64] [--epochs 4] [--device cpu]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from common import TINY  # first: puts the checkout on sys.path

from fedvit.clients.adversarial import PGD, robust_correct, torch_generator
from fedvit.clients.autoattack import autoattack_correct
from fedvit.clients.training import local_epochs
from fedvit.core.config import DataConfig
from fedvit.core.data import load_dataset
from fedvit.core.model import build_model, classify


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=4, help="natural training epochs before measuring")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.manual_seed(0)
    train, test = load_dataset(DataConfig(), 0, "train"), load_dataset(DataConfig(), 0, "test")
    model = build_model(TINY, train.num_classes, seed=0).to(device)
    local_epochs(
        model, train, np.arange(len(train)), epochs=args.epochs, batch_size=32, lr=0.05, momentum=0.9, img_size=32,
        rng=np.random.default_rng(0), device=device,
    )  # fmt: skip
    model.eval()
    x, y = (t.to(device) for t in test.batch(np.arange(args.images), 32))
    with torch.no_grad():
        natural = (classify(model, x).argmax(1) == y).float().mean().item()
    print(f"tiny ViT, {args.images} images, {device}; natural accuracy {100 * natural:.1f}%\n")
    print("| attack | robust accuracy | s per image |\n|---|---|---|")
    attacks = {
        "PGD 10 steps x 1 (robust.* default)": lambda: robust_correct(
            model, x, y, PGD(eps=8 / 255, alpha=2 / 255, steps=10), torch_generator([0], device)
        ),
        "AutoAttack apgd": lambda: autoattack_correct(model, x, y, 10, 8 / 255, "apgd", seed=0),
        "AutoAttack standard": lambda: autoattack_correct(model, x, y, 10, 8 / 255, "standard", seed=0),
    }
    for name, attack in attacks.items():
        start = time.perf_counter()
        correct = attack()
        seconds = time.perf_counter() - start
        print(f"| {name} | {100 * correct.float().mean().item():.1f}% | {seconds / args.images:.3f} |")


if __name__ == "__main__":
    main()
