"""vithead: the ClientApp (Flower's Message API); only the head travels."""

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from vithead.task import as_tensors, get_model, load_pixels, partition_size, test, train

app = ClientApp()


def local_data(context: Context):
    pid = int(context.node_config["partition-id"])
    size = partition_size(str(context.run_config["partition-sizes"]), pid)
    return as_tensors(*load_pixels(pid, size, int(context.run_config["seed"])))


@app.train()
def train_fn(msg: Message, context: Context) -> Message:
    model = get_model(int(context.run_config["num-classes"]))
    model.heads.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    images, labels = local_data(context)
    seed = int(context.run_config["seed"]) * 100 + int(msg.content["config"]["server-round"])
    optimizer = torch.optim.Adam(model.heads.parameters(), lr=float(context.run_config["lr"]))
    loss = train(model, images, labels, optimizer, epochs=int(context.run_config["local-epochs"]),
                 batch_size=int(context.run_config["batch-size"]), seed=seed)
    metrics = MetricRecord({"train_loss": loss, "num-examples": len(labels)})
    content = RecordDict({"arrays": ArrayRecord(model.heads.state_dict()), "metrics": metrics})
    return Message(content=content, reply_to=msg)


@app.evaluate()
def evaluate_fn(msg: Message, context: Context) -> Message:
    model = get_model(int(context.run_config["num-classes"]))
    model.heads.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    loss, accuracy = test(model, *local_data(context))
    metrics = MetricRecord({"eval_loss": loss, "eval_acc": accuracy, "num-examples": len(local_data(context)[1])})
    return Message(content=RecordDict({"metrics": metrics}), reply_to=msg)
