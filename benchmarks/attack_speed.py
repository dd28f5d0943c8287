"""Seconds per image of each closed-form attack (goal: ≤ 1 s for ViT-S/16 at 224 px on 2 CPU cores).

One single-image FedSGD update per model (random init, synthetic image); each attack is timed as the median of
--repeats calls and its PSNR against the true image is printed next to it.

Usage: uv run --frozen python benchmarks/attack_speed.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import dataclasses

import numpy as np
import torch
from common import TINY, VIT_S16, median_time  # first: puts the checkout on sys.path

from fedvit.attacks import april
from fedvit.audit.fedvit_run import fedvit_observation
from fedvit.audit.metrics import psnr
from fedvit.clients.training import fedsgd_gradient
from fedvit.core.config import Config
from fedvit.core.data import synthetic
from fedvit.core.model import build_model, get_weights

MODELS = {
    "tiny (default, 32 px)": TINY,
    "ViT-S/16 224 px": VIT_S16,
    "ViT-S/16 224 px, no-LN first block": dataclasses.replace(VIT_S16, first_block="no-ln"),
}
ATTACKS = {"APRIL-E (embedding route)": april.embedding_route, "APRIL attention route": april.attention_route}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(
        f"command: uv run --frozen python benchmarks/attack_speed.py --repeats {args.repeats}   "
        f"(torch threads: {torch.get_num_threads()})"
    )
    for label, model_config in MODELS.items():
        model = build_model(model_config, 10, 0)
        img = int(model.patch_embed.img_size[0])
        images = synthetic(2, 10, 0, "train")
        step = fedsgd_gradient(model, images, np.array([0]), 1, img, np.random.default_rng(0), torch.device("cpu"))
        truth = images.batch(step.batch_indices, img)[0][0].numpy()
        obs = fedvit_observation(dataclasses.replace(Config(), model=model_config), step.arrays, get_weights(model), 10)
        for name, attack in ATTACKS.items():
            seconds, rec = median_time(args.repeats, attack, obs), attack(obs)
            print(f"{label:36s} {name:26s} {seconds:7.3f} s/image  {psnr(rec.image, truth):6.1f} dB")


if __name__ == "__main__":
    main()
