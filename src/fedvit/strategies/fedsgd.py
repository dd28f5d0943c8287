"""FedSGD: the server averages client gradients and takes one SGD step."""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord, Message

from fedvit.strategies.base import FedVitStrategy


def apply_mean_gradient(w: np.ndarray, total: np.ndarray, count: np.ndarray | int, lr: float) -> np.ndarray:
    """w − η · total / count where count > 0, w unchanged where count = 0 (shared by eqs. 10 and 12).

    float32 throughout, like the model; a scalar count divides exactly as an array of that count would.
    Where count = 0 no client sent a value, so total is 0 there and dividing by 1 leaves w as it is.
    """
    count = np.asarray(count, dtype=np.float32)
    if np.any(total[count == 0]):
        raise ValueError("non-zero gradient sum where no client kept the entry")
    mean = total / np.maximum(count, np.float32(1))
    mean *= np.float32(lr)
    return w - mean


def sum_arrays(arrays: list[np.ndarray]) -> np.ndarray:
    """Σ of same-shaped float32 arrays, accumulated in the given (partition) order."""
    total = np.array(arrays[0], dtype=np.float32, copy=True)
    for a in arrays[1:]:
        total += a
    return total


def fedsgd_update(
    weights: dict[str, np.ndarray], gradients: list[dict[str, np.ndarray]], lr: float
) -> dict[str, np.ndarray]:
    """w ← w − η · (1/N) Σ_n θ_n (random-binary-weights paper, eq. 10).

    The mean is unweighted, as in eq. 10, summed in the given (partition) order.
    """
    if not gradients:
        raise ValueError("FedSGD needs at least one gradient")
    return {
        name: apply_mean_gradient(w, sum_arrays([g[name] for g in gradients]), len(gradients), lr)
        for name, w in weights.items()
    }


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
