"""cnnapp: the ServerApp with Flower's own FedAvg."""

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from cnnapp.task import Net

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    config = context.run_config
    torch.manual_seed(int(config["seed"]))
    model = Net()
    strategy = FedAvg(fraction_train=1.0, fraction_evaluate=float(config["fraction-evaluate"]), min_train_nodes=2,
                      min_evaluate_nodes=2, min_available_nodes=2)
    result = strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(model.state_dict()),
        train_config=ConfigRecord({"lr": float(config["lr"]), "local-epochs": int(config["local-epochs"])}),
        num_rounds=int(config["num-server-rounds"]),
    )
    if config["final-model"]:
        torch.save(result.arrays.to_torch_state_dict(), str(config["final-model"]))
