"""Reconstruction quality: PSNR and standard (Gaussian-window) SSIM from torchmetrics, with fixed settings.

Images are [C, H, W] float arrays in [0, 1]. The settings below are written into every audit report; note that
breaching's "SSIM" is CW-SSIM (complex wavelets) and not comparable with these numbers.
"""

from __future__ import annotations

import numpy as np
import torch
from torchmetrics.functional.image import peak_signal_noise_ratio, structural_similarity_index_measure

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
    from attacks.april import image_to_patches, lstsq, patches_to_image
    from core.params import PATCH_EMBED_WEIGHT

    w_e = obs.received[PATCH_EMBED_WEIGHT].astype(np.float64)
    w_e = w_e.reshape(w_e.shape[0], -1)
    x = image_to_patches(truth, obs)
    return patches_to_image(lstsq(w_e, w_e @ x.T).T, obs)


def match_batch(reconstructions: list[np.ndarray], truths: list[np.ndarray]) -> list[tuple[int, int, float]]:
    """One-to-one matching of reconstructions to true images maximising the total PSNR (Hungarian assignment,
    scipy's ``linear_sum_assignment``); returns (reconstruction index, truth index, PSNR) per matched pair."""
    from scipy.optimize import linear_sum_assignment

    table = np.array([[psnr(r, t) for t in truths] for r in reconstructions], dtype=np.float64)
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
