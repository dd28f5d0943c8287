"""Cost of random binary weights on a client, and the uplink they save.

For each model: the time of one client FedSGD step (forward + backward on one batch) and of drawing the
masks + encoding the reply (kept values + bit-packed masks), and the uplink bytes for several R against
dense float32. Mask time is the median of --repeats draws; the step is the median of --repeats steps.

Usage: uv run python benchmarks/mask_overhead.py [--repeats 5] [--batch-small 64] [--batch-vit-s 16]
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from common import TINY, VIT_S16, median_time  # first: puts the checkout on sys.path

from fedvit.clients.masking import draw_masks
from fedvit.clients.training import fedsgd_gradient
from fedvit.core.config import MaskConfig
from fedvit.core.data import synthetic
from fedvit.core.masks import encode, mask_rates
from fedvit.core.model import build_model

MODELS = {"tiny (default, 32 px)": TINY, "ViT-S/16 224 px": VIT_S16}


def mask_and_encode(grads: dict, shapes: dict, rates: dict) -> tuple[dict, dict]:
    return encode(grads, draw_masks(shapes, rates, seed=1, stream=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch-small", type=int, default=64)
    parser.add_argument("--batch-vit-s", type=int, default=16)
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    print(
        f"command: uv run python benchmarks/mask_overhead.py --repeats {args.repeats} "
        f"--batch-small {args.batch_small} --batch-vit-s {args.batch_vit_s}   (device: {device}, "
        f"torch threads: {torch.get_num_threads()})"
    )
    for label, cfg in MODELS.items():
        model = build_model(cfg, 10).to(device)
        img = int(model.patch_embed.img_size[0])
        batch = args.batch_small if "tiny" in label else args.batch_vit_s
        images = synthetic(batch * 2, 10, 0, "train")
        idx = np.arange(len(images))
        rng = np.random.default_rng(0)
        step_s = median_time(args.repeats, fedsgd_gradient, model, images, idx, batch, img, rng, device)
        grads = fedsgd_gradient(model, images, idx, batch, img, rng, device).arrays
        shapes = {k: g.shape for k, g in grads.items()}
        dense = sum(g.nbytes for g in grads.values())
        print(
            f"\n{label}: {sum(g.size for g in grads.values()):,} parameters, batch {batch}, "
            f"one FedSGD step {1000 * step_s:.1f} ms, dense fp32 uplink {dense / 1e6:.2f} MB"
        )
        print(
            f"  {'R':>4s} {'mask+encode ms':>15s} {'% of step':>10s} {'uplink MB':>10s} {'vs dense':>9s}"
            f" {'(1-R)+1/32':>11s}"
        )
        for r in (0.0, 0.2, 0.5, 0.8):
            rates = mask_rates(list(shapes), MaskConfig(r=r))
            mask_s = median_time(args.repeats, mask_and_encode, grads, shapes, rates)
            values, packed = mask_and_encode(grads, shapes, rates)
            sent = sum(v.nbytes for v in values.values()) + sum(p.nbytes for p in packed.values())
            print(
                f"  {r:4.1f} {1000 * mask_s:15.2f} {100 * mask_s / step_s:9.2f}% {sent / 1e6:10.2f}"
                f" {sent / dense:9.3f} {(1 - r) + 1 / 32:11.3f}"
            )


if __name__ == "__main__":
    main()
