"""The apps and tools on top: Flower's ServerApp and ClientApp (thin), the fedvit CLI, the run config as flwr resolves
it, Flower process helpers, experiments, deployment and reports."""
