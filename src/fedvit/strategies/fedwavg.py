"""FedWAvg: clients weighted by how similar their last layer is to the global one (FedWAvg paper, eq. 3).

c_k = cos(g, l_k) between the global model's last layer g and client k's l_k (Algorithm 1, line 26);
w_k = softmax(q · c)_k (line 27); G ← Σ_k w_k L_k over all parameters (lines 28–30). "Last layer" is the
classifier head's weight *and* bias, flattened together (``fedwavg.last-layer`` to change it).
"""

from __future__ import annotations

import json
from logging import INFO, WARNING

import numpy as np
from flwr.app import Array, ArrayRecord, Message
from flwr.common.logger import log

from fedvit.core.config import ConfigError
from fedvit.strategies.base import FedVitStrategy


def last_layer(arrays: dict[str, np.ndarray], names: tuple[str, ...]) -> np.ndarray:
    """The named parameters flattened into one float64 vector (the "last layer" of eq. 3)."""
    return np.concatenate([np.asarray(arrays[n], np.float64).ravel() for n in names])


def fedwavg_weights(global_last: np.ndarray, client_lasts: list[np.ndarray], q: float) -> tuple[np.ndarray, np.ndarray]:
    """(w, c): cosine similarities c_k = g·l_k / (‖g‖‖l_k‖) and weights w = softmax(q·c) (eq. 3).

    Client vectors must be finite with non-zero norm (validated before); a zero global vector makes every
    cosine undefined, and then all clients weigh the same (c = 0).
    """
    g_norm = np.linalg.norm(global_last)
    if g_norm == 0:
        c = np.zeros(len(client_lasts))
    else:
        c = np.array([global_last @ v / (g_norm * np.linalg.norm(v)) for v in client_lasts])
    z = q * c
    w = np.exp(z - z.max())  # the softmax, shifted for stability (same value)
    return w / w.sum(), c


class FedWAvg(FedVitStrategy):
    """Clients train locally (as FedAvg) and send weights; the server combines them with eq. 3's weights."""

    def __init__(self, *, q: float, last_layer_names: tuple[str, ...], **kwargs) -> None:
        super().__init__(**kwargs)
        self.q = q
        self.last_layer_names = last_layer_names

    def prepare_initial(self, grid, arrays: ArrayRecord, resumed: bool = False) -> ArrayRecord:
        """Check before round 1 that the configured last layer exists in the model."""
        missing = [n for n in self.last_layer_names if n not in arrays]
        if missing:
            raise ConfigError(
                "fedwavg.last-layer",
                ",".join(self.last_layer_names),
                f"parameter names of the model (not found: {missing}; e.g. head.weight,head.bias)",
            )
        return super().prepare_initial(grid, arrays, resumed)

    def validate_train_reply(self, msg: Message) -> str | None:
        reason = super().validate_train_reply(msg)
        if reason is None:
            arrays = {n: msg.content["arrays"][n].numpy() for n in self.last_layer_names}
            if np.linalg.norm(last_layer(arrays, self.last_layer_names)) == 0:
                reason = f"last layer {list(self.last_layer_names)} has zero norm: its cosine (eq. 3) is undefined"
        return reason

    def aggregate_arrays(self, server_round: int, replies: list[Message]) -> ArrayRecord:
        assert self.global_arrays is not None
        names = self.last_layer_names
        g = last_layer({n: self.global_arrays[n].numpy() for n in names}, names)
        if np.linalg.norm(g) == 0:
            log(WARNING, "round %d: the global last layer has zero norm; FedWAvg weighs clients equally", server_round)
        clients = [{n: a.numpy() for n, a in r.content["arrays"].items()} for r in replies]
        w, c = fedwavg_weights(g, [last_layer(arrays, names) for arrays in clients], self.q)
        total = {n: np.zeros(a.shape, np.float64) for n, a in clients[0].items()}
        for weight, arrays in zip(w, clients, strict=True):
            for n, a in arrays.items():
                total[n] += weight * a
        partitions = [self.partition_of.get(r.metadata.src_node_id, -1) for r in replies]
        self.stats[server_round].aggregation = {
            "weights": dict(zip(map(str, partitions), map(float, w), strict=True)),
            "cosines": dict(zip(map(str, partitions), map(float, c), strict=True)),
        }
        log(INFO, "round %d FedWAvg weights %s", server_round, self.stats[server_round].aggregation["weights"])
        return ArrayRecord({n: Array(v.astype(np.float32)) for n, v in total.items()})

    def write_report(self, run_dir) -> None:
        """The weights per client over the rounds (the paper's Fig. 1), from metrics.json (resume-safe)."""
        from fedvit.core.plots import plt

        rounds = json.loads((run_dir / "metrics.json").read_text())["rounds"]
        series: dict[str, list[tuple[int, float]]] = {}
        for entry in rounds:
            for partition, weight in entry.get("aggregation", {}).get("weights", {}).items():
                series.setdefault(partition, []).append((entry["round"], weight))
        if not series:
            return
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for partition in sorted(series, key=int):
            xs, ys = zip(*series[partition], strict=True)
            ax.plot(xs, ys, marker=".", label=f"client {partition}")
        ax.set_xlabel("round")
        ax.set_ylabel("FedWAvg weight (eq. 3)")
        ax.set_title(f"softmax(q·cosine), q = {self.q:g}")
        ax.legend(fontsize=7)
        fig.tight_layout()
        (run_dir / "plots").mkdir(exist_ok=True)
        fig.savefig(run_dir / "plots" / "fedwavg-weights.png", dpi=120)
        plt.close(fig)
