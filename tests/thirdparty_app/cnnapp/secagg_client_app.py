"""cnnapp's client through secure aggregation, shaped like Flower's secure-aggregation example: a NumPyClient
behind ``secaggplus_mod`` (the legacy API), training as cnnapp's own ClientApp does."""

import torch
from flwr.client import NumPyClient
from flwr.client.mod import secaggplus_mod
from flwr.clientapp import ClientApp
from flwr.common import Context

from cnnapp.client_app import local_data
from cnnapp.task import Net, train


class FlowerClient(NumPyClient):
    def __init__(self, context: Context) -> None:
        self.context = context

    def fit(self, parameters, config):
        model = Net()
        model.load_state_dict({k: torch.as_tensor(v) for k, v in zip(model.state_dict(), parameters, strict=True)})
        images, labels = local_data(self.context)
        seed = int(self.context.run_config["seed"]) * 100 + int(config["server_round"])
        train(model, images, labels, int(config["local-epochs"]), float(config["lr"]),
              int(self.context.run_config["batch-size"]), seed)
        return [v.numpy() for v in model.state_dict().values()], len(labels), {}


def client_fn(context: Context):
    return FlowerClient(context).to_client()


app = ClientApp(client_fn=client_fn, mods=[secaggplus_mod])
