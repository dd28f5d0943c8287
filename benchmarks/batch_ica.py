"""How much of an undefended FedSGD batch the patch-embedding ICA attack (fedvit.attacks.cocktail) recovers.

Per batch size: images whose matched PSNR beats their best flat image, and patches recovered (correlation > 0.9
with a true patch of the same position, after the attack placed and rescaled it), over a few client updates
made by the real client code.

    uv run --frozen python -m benchmarks.batch_ica --batch-sizes 2,3,4 -c "data.name='imagefolder:outputs/natural-32'"
    uv run --frozen python -m benchmarks.batch_ica --batch-sizes 4,16 -c "model.name='vit_small_patch16_224'" \\
        -c model.img-size=32 -c model.patch-size=16 -c model.embed-dim=0 -c model.depth=0 -c model.num-heads=0 [data]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from fedvit.app.run_config import merge_overrides
from fedvit.attacks.april import image_to_patches
from fedvit.attacks.cocktail import batch_bound, cocktail_party, unmix_patches
from fedvit.audit.benchmark import DEFENCES, Setting, client_update_and_labels, defence_config, partitions
from fedvit.audit.metrics import best_flat_image, match_batch, psnr
from fedvit.core.config import parse_config


def measure(base_overrides: list[str], batch: int, updates: int) -> dict:
    base = parse_config(merge_overrides(base_overrides))
    with tempfile.TemporaryDirectory() as tmp:
        config = defence_config(base, DEFENCES["plain"], updates, Path(tmp), Setting(batch))
        count = partitions(config, Setting(batch), updates)
        made = [client_update_and_labels(config, k, count, seed_key=1000) for k in range(updates)]
    obs = made[0][0]
    d, l_dim = obs.update["patch_embed.proj.weight"].reshape(obs.update["patch_embed.proj.weight"].shape[0], -1).shape
    n = obs.update["pos_embed"].shape[1] - 1
    bound = batch_bound(d, l_dim, n, config.model.first_block == "pre-ln")
    row = {"batch": batch, "N": n, "D": d, "L": l_dim, "bound": bound, "updates": updates}
    if batch > bound:
        return row | {"note": f"B·N = {batch * n} > rank bound {bound * n}: not run"}
    images_above = patches_found = 0
    psnrs, baselines, seconds = [], [], []
    for obs, truths, _ in made:
        start = time.perf_counter()
        rec = cocktail_party(obs)
        seconds.append(time.perf_counter() - start)
        for _, j, value in match_batch(rec.all_images, list(truths)):
            flat = psnr(best_flat_image(truths[j]), truths[j])
            psnrs.append(value)
            baselines.append(flat)
            images_above += value > flat
        found, position, _ = unmix_patches(obs, batch)
        true = np.stack([image_to_patches(t, obs) for t in truths])  # [B, N, L]
        for k in range(len(found)):
            candidates = true[:, position[k]]
            corr = max(np.corrcoef(found[k], c)[0, 1] for c in candidates)
            patches_found += corr > 0.9
    total = batch * updates
    return row | {
        "images above baseline": f"{images_above}/{total}",
        "patches recovered": f"{patches_found}/{total * n}",
        "matched PSNR": float(np.mean(psnrs)),
        "baseline PSNR": float(np.mean(baselines)),
        "seconds per update": float(np.mean(seconds)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-sizes", default="2,3,4")
    parser.add_argument("--updates", type=int, default=2)
    parser.add_argument("-c", "--run-config", action="append", default=[])
    args = parser.parse_args()
    print("| B | N | D | L | bound B ≤ | images above baseline | patches recovered | matched PSNR (dB) | "
          "baseline (dB) | s/update |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for batch in (int(b) for b in args.batch_sizes.split(",")):
        r = measure(args.run_config, batch, args.updates)
        if "note" in r:
            print(f"| {batch} | {r['N']} | {r['D']} | {r['L']} | {r['bound']} | {r['note']} | | | | |")
            continue
        print(
            f"| {batch} | {r['N']} | {r['D']} | {r['L']} | {r['bound']} | {r['images above baseline']} | "
            f"{r['patches recovered']} | {r['matched PSNR']:.1f} | {r['baseline PSNR']:.1f} | "
            f"{r['seconds per update']:.1f} |"
        )


if __name__ == "__main__":
    main()
