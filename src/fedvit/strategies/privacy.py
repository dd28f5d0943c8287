"""Central differential privacy (``dp.mode = "central"``) through Flower's own strategy wrapper.

Flower's ``DifferentialPrivacyClientSideFixedClipping`` sends the clipping norm C with every train message (the
clients' ``fixedclipping_mod`` clips to it, ``fedvit.clients.privacy``) and adds N(0, (σ·C/n)²) to the aggregate of the
n sampled clients (``compute_stdv``; McMahan et al. 2018). Here it drives a fedvit strategy: the rounds are
planned by it, and a round it refuses to aggregate (a sampled client failed) is still accounted for.
"""

from __future__ import annotations

from collections.abc import Iterable

from flwr.app import ArrayRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import DifferentialPrivacyClientSideFixedClipping
from flwr.supercore.differential_privacy import compute_stdv

from fedvit.core.config import DPConfig
from fedvit.strategies.base import FedVitStrategy


class CentralDP(DifferentialPrivacyClientSideFixedClipping):
    """Flower's client-side fixed-clipping DP wrapper around a :class:`FedVitStrategy`."""

    strategy: FedVitStrategy

    def __init__(self, strategy: FedVitStrategy, dp: DPConfig, num_sampled_clients: int) -> None:
        super().__init__(strategy, dp.noise_multiplier, dp.clipping_norm, num_sampled_clients)

    def start(self, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int = 3, **kwargs):
        """Flower's ``Strategy.start`` on this wrapper, after the wrapped strategy planned its rounds."""
        self.strategy.plan_rounds(num_rounds)
        return super().start(grid, initial_arrays, num_rounds, **kwargs)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Flower's DP aggregation; its noise std goes into the round's metrics."""
        replies = list(replies)
        if any(m.has_error() for m in replies):  # Flower's wrapper then releases nothing for the round
            self.strategy.skip_aggregation(server_round, replies, "central DP: a sampled client failed, no release")
        arrays, metrics = super().aggregate_train(server_round, replies)
        if arrays is not None:
            std = compute_stdv(self.noise_multiplier, self.clipping_norm, self.num_sampled_clients)
            self.strategy.stats[self.strategy.round_of(server_round)].train["dp-central-noise-std"] = std
        return arrays, metrics


def with_central_dp(strategy: FedVitStrategy, dp: DPConfig, num_nodes: int) -> FedVitStrategy | CentralDP:
    """What drives the rounds: ``strategy`` itself, or Flower's DP wrapper around it in central mode, calibrated to
    the clients a round samples from ``num_nodes`` connected nodes."""
    if dp.mode != "central":
        return strategy
    return CentralDP(strategy, dp, FedVitStrategy.sample_size(num_nodes, strategy.fraction_train))
