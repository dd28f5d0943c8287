"""vitb16: the ClientApp; only the head travels."""

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from vitb16.task import get_model, load_data, train

app = ClientApp()


@app.train()
def train_fn(msg: Message, context: Context) -> Message:
    model = get_model(int(context.run_config["num-classes"]))
    model.heads.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    images, labels = load_data(int(context.node_config["partition-id"]))
    optimizer = torch.optim.Adam(model.heads.parameters(), lr=float(context.run_config["lr"]))
    loss = train(model, images, labels, optimizer, epochs=int(context.run_config["local-epochs"]),
                 batch_size=int(context.run_config["batch-size"]))
    metrics = MetricRecord({"train_loss": loss, "num-examples": len(labels)})
    return Message(RecordDict({"arrays": ArrayRecord(model.heads.state_dict()), "metrics": metrics}), reply_to=msg)
