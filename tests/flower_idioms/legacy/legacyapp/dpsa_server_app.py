"""legacyapp's server under central DP and SecAgg+ (fl-dp-sa's shape): the clients clip, the server adds the
noise to the sum."""

from flwr.common import Context, ndarrays_to_parameters
from flwr.server import Grid, LegacyContext, ServerApp, ServerConfig
from flwr.server.strategy import DifferentialPrivacyClientSideFixedClipping, FedAvg
from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow

from legacyapp.task import Net, get_weights

app = ServerApp()


def on_fit_config(server_round: int):
    return {"lr": 0.05, "momentum": 0.9, "local_epochs": 1}


@app.main()
def main(grid: Grid, context: Context) -> None:
    strategy = FedAvg(fraction_fit=1.0, fraction_evaluate=0.0, min_fit_clients=3, on_fit_config_fn=on_fit_config,
                      initial_parameters=ndarrays_to_parameters(get_weights(Net())))
    strategy = DifferentialPrivacyClientSideFixedClipping(
        strategy,
        noise_multiplier=context.run_config["noise-multiplier"],
        clipping_norm=context.run_config["clipping-norm"],
        num_sampled_clients=context.run_config["num-sampled-clients"],
    )
    legacy = LegacyContext(context=context, config=ServerConfig(num_rounds=context.run_config["num-server-rounds"]),
                           strategy=strategy)
    DefaultWorkflow(fit_workflow=SecAggPlusWorkflow(num_shares=3, reconstruction_threshold=2))(grid, legacy)
