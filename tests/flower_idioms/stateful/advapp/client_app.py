"""advapp: the ClientApp; its head stays on the client between rounds."""

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from advapp.task import Net, load_data
from advapp.task import train as train_fn

app = ClientApp()
HEAD = "classification-head"


@app.train()
def train(msg: Message, context: Context):
    net = Net()
    net.load_state_dict(msg.content["arrays"].to_torch_state_dict(), strict=True)
    if HEAD in context.state:
        state_dict = context.state[HEAD].to_torch_state_dict()
        net.fc2.load_state_dict(state_dict, strict=True)
    trainloader = load_data(context.node_config["partition-id"], context.run_config["batch-size"])
    train_fn(net, trainloader, context.run_config["local-epochs"], msg.content["config"]["lr"], torch.device("cpu"))
    context.state[HEAD] = ArrayRecord(net.fc2.state_dict())
    metrics = MetricRecord({"num-examples": len(trainloader.dataset)})
    return Message(RecordDict({"arrays": ArrayRecord(net.state_dict()), "metrics": metrics}), reply_to=msg)
