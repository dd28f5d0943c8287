"""FedProx (Li et al., 2020) as the FedWAvg paper's baseline (Sec. 4.1, μ = 0.1).

Like Flower's ``FedProx`` strategy: the server aggregates as FedAvg and sends ``proximal-mu`` with each round's
config; every client then minimises its loss plus the proximal term μ/2 · ‖w − w_global‖² (fedvit.clients.training).
"""

from __future__ import annotations

from flwr.app import ConfigRecord

from fedvit.strategies.fedavg import FedAvg


class FedProx(FedAvg):
    """FedAvg aggregation; clients add μ/2 · ‖w − w_global‖² to their local loss."""

    def __init__(self, *, proximal_mu: float, **common) -> None:
        super().__init__(**common)
        if proximal_mu < 0:
            raise ValueError(f"proximal_mu must be >= 0, got {proximal_mu}")
        self.proximal_mu = proximal_mu

    def train_config(self, server_round: int, config: ConfigRecord) -> ConfigRecord:
        config = super().train_config(server_round, config)
        config["proximal-mu"] = self.proximal_mu
        return config
