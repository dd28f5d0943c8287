"""advapp: a client that keeps its classification head in ``context.state`` between rounds, trained on random
crops with padding and flips, as Flower's advanced-pytorch example does."""
