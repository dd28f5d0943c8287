"""SCAFFOLD (Karimireddy et al., 2020, Algorithm 1 with option II), a baseline of the FedWAvg paper.

Server state: the global model x and the server control variate c (kept in checkpoints). Each round the
server sends x and c; client i runs K local SGD steps on g_i(y) − c_i + c, updates its own control variate
c_i⁺ = c_i − c + (x − y) / (K · η_l) (kept by the client across rounds, fedvit.clients.scaffold) and replies with
y and Δc_i = c_i⁺ − c_i. The server applies x ← x + η_g · mean_i(y_i − x) and c ← c + (|S| / N) · mean_i(Δc_i),
with N the number of clients in the federation (lines 16-17 of the algorithm).
"""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord, Message

from fedvit.strategies.base import FedVitStrategy, check_arrays

CONTROL = "control"  # the server control variate c, sent with every train message
CONTROL_DELTA = "control-delta"  # Δc_i in each reply


class Scaffold(FedVitStrategy):
    """SCAFFOLD: drift correction with control variates; uniform mean over the sampled clients."""

    def __init__(self, *, server_lr: float = 1.0, **common) -> None:
        super().__init__(**common)
        self.server_lr = server_lr
        self.control: dict[str, np.ndarray] = {}

    def extra_train_records(self, server_round: int, arrays: ArrayRecord) -> dict[str, ArrayRecord]:
        if not self.control:  # c starts at zero (Algorithm 1, line 1)
            self.control = {name: np.zeros(a.shape, np.float32) for name, a in arrays.items()}
        return {CONTROL: ArrayRecord({name: Array(c) for name, c in self.control.items()})}

    def validate_train_reply(self, msg: Message) -> str | None:
        reason = super().validate_train_reply(msg)
        if reason is None:
            delta = msg.content.array_records.get(CONTROL_DELTA)
            reason = f"no '{CONTROL_DELTA}' ArrayRecord" if delta is None else check_arrays(delta, self._expected)
        return reason

    def federation_size(self) -> int:
        """N: the number of partitions the clients reported (falls back to the nodes seen)."""
        reported = {int(info.get("num-partitions", 0)) for info in self.node_info.values()}
        return max(max(reported, default=0), len(self.partition_of), 1)

    def aggregate_arrays(self, server_round: int, replies: list[Message]) -> ArrayRecord:
        x = {name: a.numpy() for name, a in self.global_arrays.items()}
        n_sampled, n_total = len(replies), self.federation_size()
        new = {}
        for name, value in x.items():
            dy = np.mean([r.content["arrays"][name].numpy().astype(np.float64) - value for r in replies], axis=0)
            dc = np.mean([r.content[CONTROL_DELTA][name].numpy().astype(np.float64) for r in replies], axis=0)
            new[name] = (value + self.server_lr * dy).astype(np.float32)
            self.control[name] = (self.control[name] + n_sampled / n_total * dc).astype(np.float32)
        self.stats[server_round].aggregation = {"sampled": n_sampled, "federation": n_total}
        return ArrayRecord({name: Array(v) for name, v in new.items()})

    def state_dict(self) -> dict[str, np.ndarray]:
        return {f"{CONTROL}/{name}": c for name, c in self.control.items()}

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        unknown = [k for k in state if not k.startswith(f"{CONTROL}/")]
        if unknown:
            raise ValueError(f"Scaffold: unexpected state {unknown[:3]}")
        self.control = {k.split("/", 1)[1]: v.astype(np.float32) for k, v in state.items()}
