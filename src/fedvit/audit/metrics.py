"""Scoring reconstructions: PSNR and standard (Gaussian-window) SSIM from torchmetrics with fixed settings, the
one-to-one matching of a batch, the no-information references and re-identification.

Images are [C, H, W] float arrays in [0, 1]. The settings below are written into every audit report; note that
breaching's "SSIM" is CW-SSIM (complex wavelets) and not comparable with these numbers. Reconstructions and true
images are matched one to one (Hungarian assignment on PSNR); a true image left without a reconstruction is
scored as its best flat image (what a guess without information reaches), so the mean over the batch never
rewards an attack for returning fewer images. With a decoy gallery each matched reconstruction is also
re-identified among its true image and the decoys (:mod:`fedvit.attacks.reidentification`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch
from torchmetrics.functional.image import peak_signal_noise_ratio, structural_similarity_index_measure

from fedvit.attacks import reidentification
from fedvit.attacks.reidentification import Gallery
from fedvit.audit.json_fields import from_keys
from fedvit.observed.observation import Observation, Reconstruction, first_block

DATA_RANGE = 1.0
SSIM_KERNEL = 11  # Gaussian window size (pixels); shrunk to the image size for smaller images
SSIM_SIGMA = 1.5
PSNR_CAP_DB = 200.0  # identical images have infinite PSNR; reported as this cap
SETTINGS = {
    "psnr": f"torchmetrics peak_signal_noise_ratio, data_range={DATA_RANGE}, on [0, 1] images; capped at "
    f"{PSNR_CAP_DB:g} dB",
    "ssim": f"torchmetrics structural_similarity_index_measure (standard SSIM, not CW-SSIM), Gaussian window "
    f"{SSIM_KERNEL}x{SSIM_KERNEL} (or the odd size below the image size), sigma={SSIM_SIGMA}, "
    f"data_range={DATA_RANGE}, k1=0.01, k2=0.03, mean over channels and pixels",
}


def _tensor(image: np.ndarray) -> torch.Tensor:
    x = torch.as_tensor(np.asarray(image, dtype=np.float64))
    if x.ndim != 3:
        raise ValueError(f"expected a [C, H, W] image, got shape {tuple(x.shape)}")
    return x.unsqueeze(0)


def psnr(reconstruction: np.ndarray, truth: np.ndarray) -> float:
    """PSNR in dB of ``reconstruction`` against ``truth`` (both [C, H, W] in [0, 1])."""
    if np.array_equal(reconstruction, truth):
        return PSNR_CAP_DB
    value = float(peak_signal_noise_ratio(_tensor(reconstruction), _tensor(truth), data_range=DATA_RANGE))
    return min(value, PSNR_CAP_DB)


def ssim(reconstruction: np.ndarray, truth: np.ndarray) -> float:
    """Standard SSIM of ``reconstruction`` against ``truth`` (both [C, H, W] in [0, 1])."""
    side = min(truth.shape[-2:])
    kernel = min(SSIM_KERNEL, side if side % 2 else side - 1)
    return float(
        structural_similarity_index_measure(
            _tensor(reconstruction),
            _tensor(truth),
            gaussian_kernel=True,
            sigma=SSIM_SIGMA,
            kernel_size=kernel,
            data_range=DATA_RANGE,
        )
    )


def minimum_norm_limit(truth: np.ndarray, obs) -> np.ndarray:
    """The best any route through the patch embedding can do when L > D: each true patch projected onto the
    row space of W_E (the null-space part is unobservable). A scoring reference: it takes the true image."""
    from fedvit.attacks.april import image_to_patches, lstsq, patches_to_image
    from fedvit.core.params import PATCH_EMBED_WEIGHT

    w_e = obs.received[PATCH_EMBED_WEIGHT].astype(np.float64)
    w_e = w_e.reshape(w_e.shape[0], -1)
    x = image_to_patches(truth, obs)
    return patches_to_image(lstsq(w_e, w_e @ x.T).T, obs)


def psnr_table(reconstructions: list[np.ndarray], truths: list[np.ndarray]) -> np.ndarray:
    """PSNR (dB, capped) of every reconstruction against every true image, in one matrix product (the same values
    as :func:`psnr`; thousands of images in seconds)."""
    a = np.stack(reconstructions).reshape(len(reconstructions), -1).astype(np.float64)
    b = np.stack(truths).reshape(len(truths), -1).astype(np.float64)
    mse = ((a**2).sum(1)[:, None] + (b**2).sum(1)[None, :] - 2 * a @ b.T) / a.shape[1]
    with np.errstate(divide="ignore"):
        table = 10 * np.log10(DATA_RANGE**2 / np.clip(mse, 0, None))
    for i, j in zip(*np.nonzero(table > 60.0), strict=True):  # the expansion cancels badly near zero: recompute
        table[i, j] = psnr(reconstructions[i], truths[j])
    return np.minimum(table, PSNR_CAP_DB)


def match_batch(reconstructions: list[np.ndarray], truths: list[np.ndarray]) -> list[tuple[int, int, float]]:
    """One-to-one matching of reconstructions to true images maximising the total PSNR (Hungarian assignment,
    scipy's ``linear_sum_assignment``); returns (reconstruction index, truth index, PSNR) per matched pair."""
    from scipy.optimize import linear_sum_assignment

    table = psnr_table(reconstructions, truths)
    rows, cols = linear_sum_assignment(table, maximize=True)
    return [(int(i), int(j), float(table[i, j])) for i, j in zip(rows, cols, strict=True)]


def best_flat_image(truth: np.ndarray) -> np.ndarray:
    """The truth's per-channel mean everywhere: the flat image with the highest PSNR against it."""
    return np.ascontiguousarray(np.broadcast_to(truth.mean(axis=(1, 2), keepdims=True), truth.shape))


def no_information_baselines(truth: np.ndarray, dataset_mean: np.ndarray | None = None) -> dict[str, float]:
    """PSNR an attacker reaches without any information from the update, for comparison with every attack:
    the best flat image (no flat guess does better) and, if given, the dataset's mean image."""
    out = {"best flat image": psnr(best_flat_image(truth), truth)}
    if dataset_mean is not None:
        out["dataset mean image"] = psnr(dataset_mean, truth)
    return out


BASELINE = "best flat image (reference: no information)"  # "reference" rows are not attacks
DATASET_MEAN = "dataset mean image (reference: no information)"
REID_FIELDS = ("reid-top1", "reid-rank", "reid-ranks", "reid-gallery", "reid-chance", "reid-null")
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


@dataclasses.dataclass(frozen=True)
class ImageScores:
    """A reconstruction's matched scores against the true batch (:func:`score`): mean PSNR and SSIM over every true
    image, each image's PSNR, how many were matched, and the re-identification of the matched reconstructions
    (:data:`REID_FIELDS`; None without a gallery)."""

    psnr: float | None = None
    ssim: float | None = None
    per_image_psnr: list[float] | None = None
    matched: str | None = None  # "matched/true images"
    reid_top1: float | None = None
    reid_rank: float | None = None
    reid_ranks: list[int] | None = None
    reid_gallery: int | None = None
    reid_chance: float | None = None
    reid_null: float | None = None  # the same protocol on images the update never saw (:func:`null_reid`)


def score(rec: Reconstruction, truth: np.ndarray | None, gallery: Gallery | None = None) -> ImageScores:
    """Matched scores of a reconstruction against the true batch (see the module docstring)."""
    truths = as_batch(truth)
    if rec.image is None or truths is None:
        return ImageScores()
    images = rec.all_images
    pairs = match_batch(images, truths)
    flats = [best_flat_image(t) for t in truths]
    per_psnr = [psnr(f, t) for f, t in zip(flats, truths, strict=True)]
    per_ssim = [ssim(f, t) for f, t in zip(flats, truths, strict=True)]
    for i, j, value in pairs:
        per_psnr[j], per_ssim[j] = value, ssim(images[i], truths[j])
    reid = reid_scores({j: images[i] for i, j, _ in pairs}, truths, gallery, flats)
    if gallery is not None:
        reid["reid-null"] = null_reid(images, truths, gallery)
    return from_keys(ImageScores, {"psnr": float(np.mean(per_psnr)), "ssim": float(np.mean(per_ssim)),
                                   "per-image-psnr": per_psnr, "matched": f"{len(pairs)}/{len(truths)}"} | reid)


def null_reid(images: list[np.ndarray], truths: list[np.ndarray], gallery: Gallery) -> float | None:
    """Re-identification top-1 of the same reconstructions under the same protocol (matching, then ranking) against
    images the update holds no information about: as many decoys as true images stand in for the truth, the other
    decoys form the gallery. What matching alone manufactures; None when the decoys are too few (< 2 per image)."""
    decoys = gallery.without(truths).decoys
    if len(decoys) < 2 * len(truths):
        return None
    stand_ins = [d for d in decoys[: len(truths)]]
    rest = Gallery(decoys[len(truths) :], gallery.source)
    pairs = match_batch(images, stand_ins)
    flats = [best_flat_image(t) for t in stand_ins]
    return float(reidentification.score_batch({j: images[i] for i, j, _ in pairs}, stand_ins, rest, flats)["reid-top1"])


def reid_scores(
    matched: dict[int, np.ndarray], truths: list[np.ndarray], gallery: Gallery | None, flats: list[np.ndarray]
) -> dict[str, float | int | list[int] | None]:
    """:func:`fedvit.attacks.reidentification.score_batch`, or every re-identification field None without a gallery."""
    if gallery is None:
        return dict.fromkeys(REID_FIELDS)
    return reidentification.score_batch(matched, truths, gallery, flats) | {"reid-null": None}


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
    if first_block(obs) == "no-ln":
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
