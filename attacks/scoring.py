"""Scoring a reconstruction against the client's true images, beside the no-information references.

Reconstructions and true images are matched one to one (Hungarian assignment on PSNR); a true image left without
a reconstruction is scored as its best flat image (what a guess without information reaches), so the mean over
the batch never rewards an attack for returning fewer images. With a decoy gallery each matched reconstruction is
also re-identified among its true image and the decoys (:mod:`attacks.reidentification`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from attacks import reidentification
from attacks.metrics import best_flat_image, match_batch, minimum_norm_limit, psnr, ssim
from attacks.observation import Observation, Reconstruction, first_block
from attacks.reidentification import Gallery

BASELINE = "best flat image (reference: no information)"  # "reference" rows are not attacks
DATASET_MEAN = "dataset mean image (reference: no information)"
REID_FIELDS = ("reid-top1", "reid-rank", "reid-ranks", "reid-gallery", "reid-chance")
BATCH_SCORING = (
    "reconstructions matched one to one to the true images (Hungarian assignment on PSNR, scipy); PSNR/SSIM are "
    "means over every true image of the update, an image left unmatched scored as its best flat image"
)


def as_batch(truth: np.ndarray | None) -> list[np.ndarray] | None:
    """Ground truth as a list of [C, H, W] images (a single image or a batch [n, C, H, W])."""
    if truth is None:
        return None
    truth = np.asarray(truth)
    return [truth] if truth.ndim == 3 else list(truth)


def score(rec: Reconstruction, truth: np.ndarray | None, gallery: Gallery | None = None) -> dict[str, Any]:
    """Matched scores of a reconstruction against the true batch (module docstring)."""
    truths = as_batch(truth)
    if rec.image is None or truths is None:
        return {"psnr": None, "ssim": None, "per-image-psnr": None, "matched": None} | dict.fromkeys(REID_FIELDS)
    images = rec.all_images
    pairs = match_batch(images, truths)
    flats = [best_flat_image(t) for t in truths]
    per_psnr = [psnr(f, t) for f, t in zip(flats, truths, strict=True)]
    per_ssim = [ssim(f, t) for f, t in zip(flats, truths, strict=True)]
    for i, j, value in pairs:
        per_psnr[j], per_ssim[j] = value, ssim(images[i], truths[j])
    reid = reid_scores({j: images[i] for i, j, _ in pairs}, truths, gallery, flats)
    return {
        "psnr": float(np.mean(per_psnr)),
        "ssim": float(np.mean(per_ssim)),
        "per-image-psnr": per_psnr,
        "matched": f"{len(pairs)}/{len(truths)}",
    } | reid


def reid_scores(
    matched: dict[int, np.ndarray], truths: list[np.ndarray], gallery: Gallery | None, flats: list[np.ndarray]
) -> dict[str, Any]:
    """:func:`attacks.reidentification.score_batch`, or every re-identification field None without a gallery."""
    if gallery is None:
        return dict.fromkeys(REID_FIELDS)
    return reidentification.score_batch(matched, truths, gallery, flats)


def reference_rows(
    obs: Observation, truth: np.ndarray, dataset_mean: np.ndarray | None, gallery: Gallery | None, head: dict
) -> list[dict[str, Any]]:
    """No-information references beside every scored update (and APRIL's minimum-norm limit on no-LN models);
    ``head``: the fields every row of this update carries."""
    truths = as_batch(truth)
    flats = [best_flat_image(t) for t in truths]
    references = [(BASELINE, flats, "per-channel mean of each true image")]
    if dataset_mean is not None:
        references.append((DATASET_MEAN, [dataset_mean] * len(truths), "the mean of the dataset's images"))
    if first_block(obs) == "no-ln" and obs.config is not None:
        references.append(
            ("minimum-norm limit (reference)", [minimum_norm_limit(t, obs) for t in truths], "true patches projected "
             "onto W_E's row space; not an attack")
        )  # fmt: skip
    rows = []
    for name, guesses, note in references:
        reid = reid_scores(dict(enumerate(guesses)), truths, gallery, flats)
        rows.append(
            {
                **head,
                "attack": name,
                "budget": None,
                "psnr": float(np.mean([psnr(g, t) for g, t in zip(guesses, truths, strict=True)])),
                "ssim": float(np.mean([ssim(g, t) for g, t in zip(guesses, truths, strict=True)])),
                **reid,
                "seconds": 0.0,
                "note": note,
            }
        )
    return rows


def reid_setting(galleries: list[Gallery]) -> str:
    """How re-identification was scored (or why it was not), for the report."""
    if not galleries:
        return "not scored (no decoy gallery)"
    sources = "; ".join(dict.fromkeys(g.source for g in galleries))
    return (
        f"top-1 rate and mean rank of the true image in a gallery of it and up to "
        f"{max(len(g.decoys) for g in galleries)} decoys ({sources}; the client's own images removed; chance "
        f"1/gallery size); similarity: {reidentification.SIMILARITY}; each true image's reconstruction is the one "
        "matched to it for PSNR"
    )
