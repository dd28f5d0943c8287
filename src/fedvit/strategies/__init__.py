"""The server's side of the federation: one strategy module each, registered by config name. Builds on core only
(independent of fedvit.clients); reply validation and accounting live in base.py."""

from fedvit.strategies.base import FedVitStrategy
from fedvit.strategies.fedavg import FedAvg
from fedvit.strategies.fedprox import FedProx
from fedvit.strategies.fedsgd import FedSGD
from fedvit.strategies.fedwavg import FedWAvg
from fedvit.strategies.masked_fedsgd import MaskedFedSGD
from fedvit.strategies.scaffold import Scaffold

STRATEGIES: dict[str, type[FedVitStrategy]] = {
    "fedsgd": FedSGD,
    "fedavg": FedAvg,
    "masked-fedsgd": MaskedFedSGD,
    "fedwavg": FedWAvg,
    "fedprox": FedProx,
    "scaffold": Scaffold,
}

__all__ = ["STRATEGIES", "FedAvg", "FedProx", "FedSGD", "FedVitStrategy", "FedWAvg", "MaskedFedSGD", "Scaffold"]
