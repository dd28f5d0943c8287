"""legacyapp: ``client_fn`` returning a NumPyClient; lr, momentum and epochs come from the server's
``on_fit_config_fn``."""

import torch
from flwr.client import NumPyClient
from flwr.clientapp import ClientApp
from flwr.common import Context

from legacyapp.task import Net, get_weights, load_data, set_weights, test, train


class FlowerClient(NumPyClient):
    def __init__(self, trainloader, valloader) -> None:
        super().__init__()
        self.trainloader = trainloader
        self.valloader = valloader
        self.model = Net(num_classes=10)
        self.device = "cpu"

    def fit(self, parameters, config):
        set_weights(self.model, parameters)
        lr, momentum, epochs = config["lr"], config["momentum"], config["local_epochs"]
        optim = torch.optim.SGD(self.model.parameters(), lr=lr, momentum=momentum)
        train(self.model, self.trainloader, optim, epochs=epochs, device=self.device)
        return get_weights(self.model), len(self.trainloader.dataset), {}

    def evaluate(self, parameters, config):
        set_weights(self.model, parameters)
        loss, accuracy = test(self.model, self.valloader, self.device)
        return float(loss), len(self.valloader.dataset), {"accuracy": accuracy}


def client_fn(context: Context):
    partition_id = context.node_config["partition-id"]
    num_partitions = context.node_config["num-partitions"]
    trainloader, valloader = load_data(partition_id, num_partitions)
    return FlowerClient(trainloader, valloader).to_client()


app = ClientApp(client_fn=client_fn)
