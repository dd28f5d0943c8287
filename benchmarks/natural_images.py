"""An offline image folder of natural photographs for the attack audit: random crops of scikit-image's bundled
sample images, one class per photograph, written as ``<out>/<class>/<n>.png``.

Gradient inversion behaves differently on natural images (smooth regions, edges, textures) than on fedvit's
synthetic class templates, and real datasets cannot be downloaded here. Use it as ``data.name='imagefolder:<out>'``:

    uv run --frozen python -m benchmarks.natural_images outputs/natural-32 --per-class 40
    uv run --frozen fedvit audit --benchmark --out outputs/audit -c "data.name='imagefolder:outputs/natural-32'"
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from PIL import Image

# Bundled with scikit-image (no download): seven colour photographs and three grey-scale ones (made RGB).
PHOTOS = (
    "astronaut", "chelsea", "coffee", "rocket", "immunohistochemistry", "retina", "hubble_deep_field",
    "camera", "grass", "brick",
)  # fmt: skip


def photo(name: str) -> np.ndarray:
    """A bundled photograph as uint8 RGB [H, W, 3]."""
    import skimage.data

    image = np.asarray(getattr(skimage.data, name)())
    return np.repeat(image[..., None], 3, axis=2) if image.ndim == 2 else image[..., :3]


def write_natural_images(out: Path, per_class: int = 40, size: int = 32, seed: int = 0) -> Path:
    """``per_class`` random square crops (side 1/8 to 1/2 of the photo's short side) per photograph, resized to
    ``size`` px with antialiasing; the same files for the same arguments."""
    rng = np.random.default_rng(seed)
    for name in PHOTOS:
        image = photo(name)
        h, w = image.shape[:2]
        folder = out / name
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            side = int(rng.integers(min(h, w) // 8, min(h, w) // 2 + 1))
            top, left = int(rng.integers(0, h - side + 1)), int(rng.integers(0, w - side + 1))
            crop = Image.fromarray(image[top : top + side, left : left + side]).resize((size, size), Image.LANCZOS)
            crop.save(folder / f"{i:04d}.png")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--per-class", type=int, default=40)
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.per_class < 1 or args.size < 8:
        parser.error("--per-class must be >= 1 and --size >= 8")
    write_natural_images(args.out, args.per_class, args.size, args.seed)
    print(f"{len(PHOTOS)} classes × {args.per_class} images of {args.size} px in {args.out}")


if __name__ == "__main__":
    main()
