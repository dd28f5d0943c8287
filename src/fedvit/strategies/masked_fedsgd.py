"""Masked FedSGD: per-entry means over the clients that kept each gradient entry (random-binary-weights paper)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from flwr.app import Array, ArrayRecord, Message

from fedvit.core.config import MaskConfig
from fedvit.core.masks import decode, effective_rates
from fedvit.strategies.base import check_metrics
from fedvit.strategies.fedsgd import FedSGD, apply_mean_gradient, sum_arrays


def masked_update(
    weights: dict[str, np.ndarray], replies: list[tuple[dict[str, np.ndarray], dict[str, np.ndarray]]], lr: float
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Eq. 12 of the random-binary-weights paper, per entry i:

    w_i ← w_i − η · Σ_n θ'_n,i / Σ_n B_n,i   if Σ_n B_n,i > 0,   w_i unchanged if Σ_n B_n,i = 0.

    ``replies`` holds (dense masked gradient θ', boolean mask B) per client. Returns
    the new weights and the per-entry counts Σ_n B_n,i.
    """
    new, counts = {}, {}
    for name, w in weights.items():
        count = np.zeros(w.shape, dtype=np.int32)
        for _, masks in replies:
            count += masks[name]
        new[name] = apply_mean_gradient(w, sum_arrays([grads[name] for grads, _ in replies]), count, lr)
        counts[name] = count
    return new, counts


class MaskedFedSGD(FedSGD):
    """Clients send kept gradient values plus bit-packed masks; the server applies eq. 12.

    It also counts, per parameter, in how many rounds it was updated (paper Sec. IV-D).
    """

    def __init__(self, *, lr: float, mask: MaskConfig, **kwargs) -> None:
        super().__init__(lr=lr, **kwargs)
        self.mask = mask  # public: the server knows R, only the masks themselves are private
        self.update_counts: dict[str, np.ndarray] = {}
        self.clients_per_round: list[int] = []  # valid replies in each aggregated round
        self._decoded: dict[int, tuple[dict, dict]] = {}

    def validate_train_reply(self, msg: Message) -> str | None:
        """Both records present, names as the model's, masks and values consistent and finite."""
        reason = check_metrics(msg.content)
        if reason is not None:
            return reason
        values, packed = msg.content.array_records.get("arrays"), msg.content.array_records.get("masks")
        if values is None or packed is None:
            return "needs both 'arrays' (kept values) and 'masks' (packed bits) records"
        for record, label in ((values, "values"), (packed, "masks")):
            if set(record.keys()) != set(self._expected):
                return f"{label}: parameter names differ from the model's"
        grads, masks = {}, {}
        for name, shape in self._expected.items():
            v = values[name].numpy()
            if v.dtype != np.float32:
                return f"{name}: values dtype {v.dtype} is not float32"
            if not np.isfinite(v).all():
                return f"{name}: values contain NaN or Inf"
            try:
                grads[name], masks[name] = decode(v, packed[name].numpy(), shape)
            except ValueError as err:
                return f"{name}: {err}"
        self._decoded[id(msg)] = (grads, masks)
        return None

    def aggregate_arrays(self, server_round: int, replies: list[Message]) -> ArrayRecord:
        assert self.global_arrays is not None
        weights = {name: a.numpy() for name, a in self.global_arrays.items()}
        decoded = [self._decoded.pop(id(r)) for r in replies]
        self._decoded.clear()
        new, counts = masked_update(weights, decoded, self.lr)
        for name, count in counts.items():
            self.update_counts.setdefault(name, np.zeros(count.shape, np.int32))
            self.update_counts[name] += count > 0
        self.clients_per_round.append(len(replies))
        return ArrayRecord({name: Array(value) for name, value in new.items()})

    def state_dict(self) -> dict[str, np.ndarray]:
        state = {f"update-counts/{k}": v for k, v in self.update_counts.items()}
        return state | {"clients-per-round": np.array(self.clients_per_round, dtype=np.int64)}

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        prefix = "update-counts/"
        self.update_counts = {k[len(prefix) :]: v.astype(np.int32) for k, v in state.items() if k.startswith(prefix)}
        self.clients_per_round = [int(n) for n in state["clients-per-round"]]

    def write_report(self, run_dir: Path) -> None:
        from fedvit.strategies.update_counts import write_update_count_report

        rates = effective_rates(list(self.update_counts), self.mask)
        locked = self.mask.mode == "locked"
        write_update_count_report(self.update_counts, self.clients_per_round, rates, run_dir, locked)
