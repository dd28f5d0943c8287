"""The server's side of the federation: one strategy module each, registered by config name. Builds on core only
(independent of clients/); reply validation and accounting live in base.py."""

from strategies.base import FedVitStrategy
from strategies.fedavg import FedAvg
from strategies.fedprox import FedProx
from strategies.fedsgd import FedSGD
from strategies.fedwavg import FedWAvg
from strategies.masked_fedsgd import MaskedFedSGD
from strategies.scaffold import Scaffold

STRATEGIES: dict[str, type[FedVitStrategy]] = {
    "fedsgd": FedSGD,
    "fedavg": FedAvg,
    "masked-fedsgd": MaskedFedSGD,
    "fedwavg": FedWAvg,
    "fedprox": FedProx,
    "scaffold": Scaffold,
}

__all__ = ["STRATEGIES", "FedAvg", "FedProx", "FedSGD", "FedVitStrategy", "FedWAvg", "MaskedFedSGD", "Scaffold"]
