"""Re-identification: would a person holding a gallery of images pick the true one from a reconstruction?

PSNR rewards getting the average colour right and punishes sharp but shifted detail, so a clearly recognisable
reconstruction can score below a flat image. Here each reconstruction (matched to its true image as in the
audit's scoring) is compared with a gallery of K images: the true one and K − 1 decoys from the dataset's test
split (never an image of the client's own batch). The similarity is the zero-mean normalised cross-correlation
(Pearson r over all pixels and channels after removing each image's per-channel mean): it measures structure,
not average colour, so a flat image correlates 0 with every gallery image and is re-identified at chance, 1/K.
Ties count as shared places (expected rank), so chance is exact for flat images.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

SIMILARITY = (
    "zero-mean normalised cross-correlation (Pearson r over all pixels and channels after removing each image's "
    "per-channel mean; a flat image scores 0 against every image)"
)
SAME_IMAGE_TOLERANCE = 0.5 / 255  # a pool image this close (max abs pixel difference) to a batch image is that image
_FLAT = 1e-9  # norm below which an image has no structure


def _structure(images: np.ndarray) -> np.ndarray:
    """Images [n, C, H, W] as unit vectors of their per-channel-mean-free pixels (zero vectors where flat)."""
    x = np.asarray(images, dtype=np.float64)
    x = (x - x.mean(axis=(2, 3), keepdims=True)).reshape(len(x), -1)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return np.where(norms > _FLAT, x / np.maximum(norms, _FLAT), 0.0)


def similarity(a: np.ndarray, b: np.ndarray) -> float:
    """The re-identification similarity of two [C, H, W] images (see :data:`SIMILARITY`)."""
    u, v = _structure(np.stack([a, b]))
    return float(u @ v)


@dataclass(frozen=True)
class Gallery:
    """Decoy images [K − 1, C, H, W] in [0, 1] and where they came from."""

    decoys: np.ndarray
    source: str

    @cached_property
    def vectors(self) -> np.ndarray:
        """The decoys as unit structure vectors (see :data:`SIMILARITY`), computed once per gallery."""
        return _structure(self.decoys) if len(self.decoys) else np.zeros((0, 0))

    @property
    def size(self) -> int:
        """K: the decoys plus the true image."""
        return len(self.decoys) + 1

    def without(self, batch: list[np.ndarray]) -> Gallery:
        """The gallery with every decoy that is one of ``batch``'s images removed (decoys never include them)."""
        if not len(self.decoys) or not batch:
            return self
        stacked = np.stack(batch).astype(np.float64).reshape(len(batch), -1)
        decoys = self.decoys.astype(np.float64).reshape(len(self.decoys), -1)
        # Two images within the tolerance everywhere have means within it too: only decoys whose mean is that close
        # to a batch image's are compared pixel by pixel (the slack covers the means' rounding).
        order = np.argsort(means := stacked.mean(axis=1))
        reach = SAME_IMAGE_TOLERANCE + 1e-9
        low = np.searchsorted(means[order], decoys.mean(axis=1) - reach, side="left")
        high = np.searchsorted(means[order], decoys.mean(axis=1) + reach, side="right")
        keep = np.ones(len(decoys), dtype=bool)
        for i in np.flatnonzero(high > low):
            near = stacked[order[low[i] : high[i]]]
            keep[i] = not (np.abs(near - decoys[i]).max(axis=1) <= SAME_IMAGE_TOLERANCE).any()
        return Gallery(self.decoys[keep], self.source)


def rank(reconstruction: np.ndarray, truth: np.ndarray, gallery: Gallery) -> tuple[float, float]:
    """(rank of the true image among the gallery, 1 = first; top-1 credit) for one reconstruction.

    Gallery images exactly as similar as the truth share its place: rank 1 + better + ties/2, and top-1 credit
    1/(1 + ties) when no decoy is more similar (so a flat reconstruction gets exactly 1/K)."""
    r = _structure(reconstruction[None])[0]
    true_score = float(r @ _structure(truth[None])[0])
    scores = gallery.vectors @ r if len(gallery.decoys) else np.zeros(0)
    tolerance = 1e-12
    better = int((scores > true_score + tolerance).sum())
    ties = int((np.abs(scores - true_score) <= tolerance).sum())
    return 1 + better + ties / 2, (1.0 / (1 + ties) if better == 0 else 0.0)


def score_batch(
    matched: dict[int, np.ndarray], truths: list[np.ndarray], gallery: Gallery, unmatched: list[np.ndarray]
) -> dict[str, float | int | list[float]]:
    """Re-identification of one update: ``matched`` maps a true image's index to its reconstruction; a true image
    without one is scored with ``unmatched[j]`` (the audit's stand-in, the best flat image). Decoys are the
    gallery minus the batch. Returns the top-1 rate, mean rank, per-image ranks, gallery size and chance."""
    own = gallery.without(truths)
    ranks, hits = [], []
    for j, truth in enumerate(truths):
        r, hit = rank(matched.get(j, unmatched[j]), truth, own)
        ranks.append(r)
        hits.append(hit)
    return {
        "reid-top1": float(np.mean(hits)),
        "reid-rank": float(np.mean(ranks)),
        "reid-ranks": ranks,
        "reid-gallery": own.size,
        "reid-chance": 1.0 / own.size,
    }


def evenly_spaced(total: int, count: int) -> np.ndarray:
    """Indices of ``count`` items spread evenly over ``total`` (all of them when ``count`` ≥ ``total``)."""
    return np.unique(np.linspace(0, total - 1, num=min(count, total)).round().astype(np.int64))
