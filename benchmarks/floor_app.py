"""Flower's own floor for the deployment benchmark: a ServerApp and a ClientApp that import nothing heavy.

The ClientApp echoes the arrays it received at once; the ServerApp runs Flower's stock FedAvg (train messages
only, like fedvit's merged rounds) over zero arrays with the names and shapes of the run's model (read from
``floor_shapes.json`` beside this file, written by ``deployment_latency.py``: the same objects on the wire as
fedvit's messages), through the same reply polling as fedvit's ServerApp, and writes each round's wall time to
``<out-dir>/<run-name>/floor-rounds.json``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from fedvit_app.polling_grid import PollingGrid, poll_interval

SHAPES_FILE = Path(__file__).with_name("floor_shapes.json")

server = ServerApp()
client = ClientApp()


@server.main()
def main(grid: Grid, context: Context) -> None:
    rc = context.run_config
    nodes = int(rc["min-nodes"])
    stamps: list[float] = []
    strategy = FedAvg(fraction_evaluate=0.0, min_train_nodes=nodes, min_available_nodes=nodes)
    strategy.start(
        grid=PollingGrid(grid, poll_interval()),
        initial_arrays=ArrayRecord(
            {
                name: Array(np.zeros(shape, dtype=np.float32))
                for name, shape in json.loads(SHAPES_FILE.read_text()).items()
            }
        ),
        num_rounds=int(rc["num-server-rounds"]),
        train_config=ConfigRecord({"lr": 0.0}),
        evaluate_fn=lambda server_round, arrays: stamps.append(time.perf_counter()),
    )
    out = Path(str(rc["out-dir"])) / str(rc["run-name"])
    out.mkdir(parents=True, exist_ok=True)
    rounds = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
    (out / "floor-rounds.json").write_text(json.dumps({"round-s": rounds}))


@client.train()
def train(msg: Message, context: Context) -> Message:
    content = RecordDict({"arrays": msg.content["arrays"], "metrics": MetricRecord({"num-examples": 1})})
    return Message(content, reply_to=msg)
