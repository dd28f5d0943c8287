"""vithead: the ServerApp with Flower's own FedAvg over the head's arrays."""

import torch
from flwr.app import ArrayRecord, Context
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from vithead.task import get_model

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    config = context.run_config
    model = get_model(int(config["num-classes"]))
    strategy = FedAvg(fraction_train=1.0, fraction_evaluate=1.0, min_train_nodes=2, min_evaluate_nodes=2,
                      min_available_nodes=2)
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord(model.heads.state_dict()),
                            num_rounds=int(config["num-server-rounds"]))
    if config["final-model"]:
        torch.save(result.arrays.to_torch_state_dict(), str(config["final-model"]))
