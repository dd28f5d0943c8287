"""cnnapp through secure aggregation, shaped like Flower's secure-aggregation example: the legacy workflow API
(``LegacyContext``, ``DefaultWorkflow(fit_workflow=SecAggPlusWorkflow(...))``) and Flower's legacy FedAvg."""

import torch
from flwr.common import Context, ndarrays_to_parameters
from flwr.server import Grid, LegacyContext, ServerApp, ServerConfig
from flwr.server.strategy import FedAvg
from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow

from cnnapp.task import Net

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    config = context.run_config
    torch.manual_seed(int(config["seed"]))
    start = [v.numpy() for v in Net().state_dict().values()]
    nodes = int(config["secagg-nodes"])

    def fit_config(server_round: int) -> dict:
        return {"server_round": server_round, "lr": float(config["lr"]), "local-epochs": int(config["local-epochs"])}

    strategy = FedAvg(fraction_fit=1.0, fraction_evaluate=0.0, min_fit_clients=nodes - int(config["secagg-drop"]),
                      min_available_clients=nodes, initial_parameters=ndarrays_to_parameters(start),
                      on_fit_config_fn=fit_config, accept_failures=True)
    legacy = LegacyContext(context=context, config=ServerConfig(num_rounds=int(config["num-server-rounds"])),
                           strategy=strategy)
    fit = SecAggPlusWorkflow(num_shares=int(config["secagg-shares"]),
                             reconstruction_threshold=int(config["secagg-threshold"]))
    DefaultWorkflow(fit_workflow=fit)(grid, legacy)
    if config["final-model"]:  # the global model the server ended on (the last round's aggregate)
        final = legacy.state.array_records["parameters"].to_numpy_ndarrays()
        names = list(Net().state_dict())
        torch.save({n: torch.as_tensor(a) for n, a in zip(names, final, strict=True)}, str(config["final-model"]))
