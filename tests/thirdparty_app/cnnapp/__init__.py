"""cnnapp: a small CNN trained with Flower's FedAvg on offline synthetic images."""
