"""Server strategies, one module each, registered by config name."""

from strategies.base import FedVitStrategy
from strategies.fedavg import FedAvg
from strategies.fedsgd import FedSGD

STRATEGIES: dict[str, type[FedVitStrategy]] = {"fedsgd": FedSGD, "fedavg": FedAvg}

__all__ = ["STRATEGIES", "FedAvg", "FedSGD", "FedVitStrategy"]
