"""Server strategies, one module each, registered by config name."""

from strategies.base import FedVitStrategy
from strategies.fedavg import FedAvg
from strategies.fedsgd import FedSGD
from strategies.fedwavg import FedWAvg
from strategies.masked_fedsgd import MaskedFedSGD

STRATEGIES: dict[str, type[FedVitStrategy]] = {
    "fedsgd": FedSGD,
    "fedavg": FedAvg,
    "masked-fedsgd": MaskedFedSGD,
    "fedwavg": FedWAvg,
}

__all__ = ["STRATEGIES", "FedAvg", "FedSGD", "FedVitStrategy", "FedWAvg", "MaskedFedSGD"]
