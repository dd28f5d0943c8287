"""cnnapp: the ClientApp (Flower's Message API, as in Flower's PyTorch quickstart)."""

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.clientapp.mod import LocalDpMod

from cnnapp.task import Net, load_data, partition_size
from cnnapp.task import test as test_fn
from cnnapp.task import train as train_fn

app = ClientApp()


def local_data(context: Context):
    pid = int(context.node_config["partition-id"])
    size = partition_size(str(context.run_config["partition-sizes"]), pid)
    return load_data(pid, size, int(context.run_config["seed"]), float(context.run_config["dirichlet-alpha"]),
                     str(context.run_config["images"]))


def local_dp(msg: Message, context: Context, call_next) -> Message:
    """Flower's LocalDpMod when the run config asks for it (``local-dp-epsilon`` > 0)."""
    epsilon = float(context.run_config["local-dp-epsilon"])
    if epsilon <= 0:
        return call_next(msg, context)
    settings = [float(context.run_config[f"local-dp-{key}"]) for key in ("clip", "sensitivity")]
    return LocalDpMod(*settings, epsilon, float(context.run_config["local-dp-delta"]))(msg, context, call_next)


@app.train(mods=[local_dp])
def train(msg: Message, context: Context) -> Message:
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    images, labels = local_data(context)
    config = msg.content["config"]
    seed = int(context.run_config["seed"]) * 100 + int(config["server-round"])
    loss = train_fn(model, images, labels, int(config["local-epochs"]), float(config["lr"]),
                 int(context.run_config["batch-size"]), seed)
    content = RecordDict(
        {
            "arrays": ArrayRecord(model.state_dict()),
            "metrics": MetricRecord({"train_loss": loss, "num-examples": len(labels)}),
        }
    )
    return Message(content=content, reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    images, labels = local_data(context)
    loss, accuracy = test_fn(model, images, labels)
    metrics = MetricRecord({"eval_loss": loss, "eval_acc": accuracy, "num-examples": len(labels)})
    return Message(content=RecordDict({"metrics": metrics}), reply_to=msg)
