"""legacyapp's server, the legacy way: ``ServerApp(server_fn=…)`` with Flower's legacy FedAvg, whose
``on_fit_config_fn`` sends lr, momentum and epochs to the clients."""

from flwr.common import Context, ndarrays_to_parameters
from flwr.server import ServerApp, ServerAppComponents, ServerConfig
from flwr.server.strategy import FedAvg

from legacyapp.task import Net, get_weights


def on_fit_config(server_round: int):
    return {"lr": 0.05, "momentum": 0.9, "local_epochs": 1}


def server_fn(context: Context):
    strategy = FedAvg(fraction_fit=1.0, fraction_evaluate=0.0, on_fit_config_fn=on_fit_config,
                      initial_parameters=ndarrays_to_parameters(get_weights(Net())))
    config = ServerConfig(num_rounds=context.run_config["num-server-rounds"])
    return ServerAppComponents(strategy=strategy, config=config)


app = ServerApp(server_fn=server_fn)
