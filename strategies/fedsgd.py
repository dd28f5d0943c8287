"""FedSGD: the server averages client gradients and takes one SGD step."""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord, Message

from strategies.base import FedVitStrategy


def apply_mean_gradient(w: np.ndarray, total: np.ndarray, count: np.ndarray | int, lr: float) -> np.ndarray:
    """w − η · total / count where count > 0, w unchanged where count = 0 (shared by eqs. 10 and 12)."""
    count = np.asarray(count)
    with np.errstate(divide="ignore", invalid="ignore"):
        stepped = w - lr * (total / count)
    return np.where(count > 0, stepped, w).astype(w.dtype)


def fedsgd_update(
    weights: dict[str, np.ndarray], gradients: list[dict[str, np.ndarray]], lr: float
) -> dict[str, np.ndarray]:
    """w ← w − η · (1/N) Σ_n θ_n (random-binary-weights paper, eq. 10).

    The mean is unweighted, as in eq. 10; it is accumulated in float64 in the
    given (partition) order and the result cast back to each weight's dtype.
    """
    if not gradients:
        raise ValueError("FedSGD needs at least one gradient")
    out = {}
    for name, w in weights.items():
        total = np.zeros(w.shape, dtype=np.float64)
        for grad in gradients:
            total += grad[name]
        out[name] = apply_mean_gradient(w, total, len(gradients), lr)
    return out


class FedSGD(FedVitStrategy):
    """Clients send the gradient of one local batch; the server applies eq. 10."""

    def __init__(self, *, lr: float, **kwargs) -> None:
        super().__init__(**kwargs)
        self.lr = lr

    def aggregate_arrays(self, server_round: int, replies: list[Message]) -> ArrayRecord:
        assert self.global_arrays is not None
        weights = {name: a.numpy() for name, a in self.global_arrays.items()}
        grads = [{name: a.numpy() for name, a in r.content["arrays"].items()} for r in replies]
        new = fedsgd_update(weights, grads, self.lr)
        return ArrayRecord({name: Array(value) for name, value in new.items()})
