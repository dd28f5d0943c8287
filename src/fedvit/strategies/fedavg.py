"""FedAvg on fedvit's base: Flower's own weighted average over validated, sorted replies."""

from __future__ import annotations

from flwr.app import ArrayRecord, Message
from flwr.serverapp.strategy.strategy_utils import aggregate_arrayrecords

from fedvit.strategies.base import FedVitStrategy


class FedAvg(FedVitStrategy):
    """Clients train locally and send weights; the server averages them weighted by num-examples."""

    def aggregate_arrays(self, server_round: int, replies: list[Message]) -> ArrayRecord:
        return aggregate_arrayrecords([r.content for r in replies], self.weighted_by_key)
