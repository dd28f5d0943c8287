"""aeapp: the ClientApp (Message API) hands the module to a Lightning Trainer."""

import lightning.pytorch as pl
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from aeapp.task import LitAutoEncoder, load_data

app = ClientApp()


@app.train()
def train(msg: Message, context: Context):
    model = LitAutoEncoder()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    trainloader = load_data(context.node_config["partition-id"], context.node_config["num-partitions"])
    trainer = pl.Trainer(max_epochs=context.run_config["max-epochs"], enable_progress_bar=False, logger=False,
                         enable_checkpointing=False, accelerator="cpu")
    trainer.fit(model, trainloader)
    metrics = MetricRecord({"num-examples": len(trainloader.dataset)})
    return Message(RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": metrics}), reply_to=msg)
