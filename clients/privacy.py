"""Differential privacy of one client update: per-client fixed clipping, and Gaussian noise in "local" mode.

The arithmetic is Flower's own (``flwr.supercore.differential_privacy``: ``compute_clip_model_update``, FlatClip of
McMahan et al. 2018, and ``add_gaussian_noise_inplace``), the functions behind Flower's ``fixedclipping_mod`` and
``LocalDpMod``. Those mods themselves cannot wrap fedvit's replies: they read the reply as new weights in a single
ArrayRecord, while a FedSGD reply is a gradient. So the client applies the same functions to its model update
here — FedSGD: the step lr·g it asks the server to take; FedAvg: w_new − w_received — before encrypting it.
"""

from __future__ import annotations

import math

import numpy as np
from flwr.supercore.differential_privacy import add_gaussian_noise_inplace, compute_clip_model_update, get_norm

from core.config import DPConfig


def local_epsilon(dp: DPConfig) -> float:
    """ε of one release of the Gaussian mechanism with std σ·C at ``dp.delta`` (σ = √(2 ln(1.25/δ)) / ε, Dwork &
    Roth 2014, Thm. A.1; their bound is stated for ε < 1, larger values are only indicative)."""
    if dp.noise_multiplier == 0:
        return math.inf
    return math.sqrt(2 * math.log(1.25 / dp.delta)) / dp.noise_multiplier


def privatize(
    arrays: dict[str, np.ndarray],
    received: dict[str, np.ndarray],
    dp: DPConfig,
    sends_gradient: bool,
    lr: float,
) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """The client's reply arrays after clipping (and local noise); returns them and the DP metrics.

    ``arrays`` are the gradient (``sends_gradient``, applied by the server with step ``lr``) or the new weights;
    ``received`` the plain weights the client started from. Works in float64 (a gradient is small next to the
    weights) and returns float32 like every reply.
    """
    names = list(arrays)
    start = [np.asarray(received[n], np.float64) for n in names]
    if sends_gradient:  # the model the server would reach with this gradient alone
        model = [w - lr * np.asarray(arrays[n], np.float64) for w, n in zip(start, names, strict=True)]
    else:
        model = [np.asarray(arrays[n], np.float64) for n in names]
    norm = get_norm([m - w for m, w in zip(model, start, strict=True)])
    compute_clip_model_update(model, start, dp.clipping_norm)
    metrics = {"dp-update-norm": norm, "dp-clipped": float(norm > dp.clipping_norm)}
    if dp.mode == "local":
        update = [m - w for m, w in zip(model, start, strict=True)]
        add_gaussian_noise_inplace(update, dp.noise_multiplier * dp.clipping_norm)
        model = [w + u for w, u in zip(start, update, strict=True)]
        metrics["dp-noise-std"] = dp.noise_multiplier * dp.clipping_norm
    if sends_gradient:
        out = [(w - m) / lr for w, m in zip(start, model, strict=True)]
    else:
        out = model
    return {n: o.astype(np.float32) for n, o in zip(names, out, strict=True)}, metrics
