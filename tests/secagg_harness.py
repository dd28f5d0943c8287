"""Flower's SecAgg+ (the legacy workflow API, as Flower's secure-aggregation example uses it) run in this process:
``SecAggPlusWorkflow`` on the server, ``secaggplus_mod`` on every client with ``capture_mod`` outside it, each message
copied on its way as the wire would. For the capture and audit tests of secure aggregation, without Ray."""

from __future__ import annotations

import copy
import dataclasses
import itertools
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from flwr.app import Context, Message, RecordDict
from flwr.app.message import make_message
from flwr.client import NumPyClient
from flwr.client.mod import secaggplus_mod
from flwr.clientapp import ClientApp
from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays
from flwr.server import LegacyContext, ServerConfig
from flwr.server.strategy import FedAvg
from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow

from fedvit.capture.writer import capture_mod
from tests.helpers import reply_metadata

APP = Path(__file__).parent / "thirdparty_app"
sys.path.insert(0, str(APP))

from cnnapp.task import Net, load_data, partition_size, train  # noqa: E402

SIZES, SEED = "1,2,3,4", 7  # cnnapp_partitions:partition's sizes: scoring with --data matches


def tiny(partition: int):
    """cnnapp_partitions:partition (1-4 images per client)."""
    return load_data(partition, partition_size(SIZES, partition), SEED)


@dataclasses.dataclass(frozen=True)
class Recipe:
    """What each client trains: its partition's images (``load``), one SGD pass per epoch (cnnapp's ``train``:
    momentum 0.9, in its code only)."""

    load: Callable[[int], tuple[np.ndarray, np.ndarray]] = tiny
    lr: float = 0.05
    epochs: int = 1
    batch: int = 4


class Client(NumPyClient):
    """Flower's quickstart CNN trained with SGD (momentum 0.9) on its partition, as in Flower's secure-aggregation
    example; ``drop_round``: the client fails in that round (lost mid-round)."""

    def __init__(self, partition: int, drop_round: int | None, recipe: Recipe) -> None:
        self.partition, self.drop_round, self.recipe = partition, drop_round, recipe

    def fit(self, parameters, config):
        if config.get("server_round") == self.drop_round:
            raise RuntimeError("client lost")
        model = Net()
        model.load_state_dict({k: torch.as_tensor(v) for k, v in zip(model.state_dict(), parameters, strict=True)})
        images, labels = self.recipe.load(self.partition)
        r = self.recipe
        train(model, images, labels, epochs=r.epochs, lr=r.lr, batch_size=r.batch, seed=int(config["server_round"]))
        return [v.numpy() for v in model.state_dict().values()], len(labels), {}


class InProcessGrid:
    """Answers every message by calling the ClientApp of its node in this process, on a copy of the message."""

    def __init__(self, app: ClientApp, num_nodes: int, capture_dir: Path, batch: int) -> None:
        self.app = app
        self.contexts = {
            1000 + p: Context(run_id=1, node_id=1000 + p, node_config={"partition-id": p}, state=RecordDict(),
                              run_config={"fedvit-capture-dir": str(capture_dir), "batch-size": batch})  # fmt: skip
            for p in range(num_nodes)
        }
        self._ids = itertools.count()
        self.run = type("Run", (), {"run_id": 1})()  # what Flower's legacy client manager reads

    def get_node_ids(self) -> list[int]:
        return list(self.contexts)

    def send_and_receive(self, messages, *, timeout=None):
        replies = []
        for sent in messages:
            node = sent.metadata.dst_node_id
            msg = Message(content=copy.deepcopy(sent.content), dst_node_id=node,
                          message_type=sent.metadata.message_type, group_id=sent.metadata.group_id)  # fmt: skip
            msg.metadata.__dict__["_message_id"] = f"m{next(self._ids)}"
            meta = reply_metadata(node, msg.metadata.message_type)
            meta.__dict__["_reply_to_message_id"] = msg.metadata.message_id
            try:
                reply = self.app(msg, self.contexts[node])
                replies.append(make_message(meta, content=reply.content))
            except Exception as err:  # noqa: BLE001 - Flower turns a failed ClientApp into an error reply
                from flwr.app import Error

                replies.append(make_message(meta, error=Error(code=1, reason=str(err))))
        return replies


def run_secagg(capture_dir: Path, num_nodes: int = 4, rounds: int = 2, drop: tuple[int, int] | None = None,
               num_shares: int = 3, threshold: int = 2, recipe: Recipe = Recipe(),
               secure: bool = True) -> list[list[np.ndarray]]:  # fmt: skip
    """A FedAvg run of ``rounds`` rounds, through SecAgg+ (``secure``) or plain; ``drop`` = (partition, round)
    fails that client's training in that round. Returns the global model after each round."""
    dropping = dict([drop]) if drop else {}

    def client_fn(context: Context):
        partition = int(context.node_config["partition-id"])
        return Client(partition, dropping.get(partition), recipe).to_client()

    app = ClientApp(client_fn=client_fn, mods=[capture_mod, secaggplus_mod] if secure else [capture_mod])
    grid = InProcessGrid(app, num_nodes, capture_dir, recipe.batch)
    torch.manual_seed(0)
    start = [v.numpy() for v in Net().state_dict().values()]
    models = []

    def round_config(server_round: int) -> dict:
        return {"server_round": server_round, "lr": recipe.lr, "local-epochs": recipe.epochs}

    class Recording(FedAvg):
        def aggregate_fit(self, server_round, results, failures):
            parameters, metrics = super().aggregate_fit(server_round, results, failures)
            models.append(parameters_to_ndarrays(parameters))
            return parameters, metrics

    strategy = Recording(fraction_fit=1.0, fraction_evaluate=0.0, min_fit_clients=num_nodes - bool(drop),
                         min_available_clients=num_nodes, initial_parameters=ndarrays_to_parameters(start),
                         on_fit_config_fn=round_config, accept_failures=True)  # fmt: skip
    context = LegacyContext(context=Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={}),
                            config=ServerConfig(num_rounds=rounds), strategy=strategy)  # fmt: skip
    fit = SecAggPlusWorkflow(num_shares=num_shares, reconstruction_threshold=threshold) if secure else None
    DefaultWorkflow(fit_workflow=fit)(grid, context)
    return models
