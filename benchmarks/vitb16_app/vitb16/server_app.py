"""vitb16: Flower's FedAvg over the head's arrays."""

from flwr.app import ArrayRecord, Context
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from vitb16.task import get_model

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    model = get_model(int(context.run_config["num-classes"]))
    FedAvg(fraction_evaluate=0.0, min_train_nodes=2, min_available_nodes=2).start(
        grid=grid, initial_arrays=ArrayRecord(model.heads.state_dict()),
        num_rounds=int(context.run_config["num-server-rounds"]))
