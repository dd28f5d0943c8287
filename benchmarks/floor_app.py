"""Flower's own floor for the deployment benchmark: a ServerApp and a ClientApp that import nothing heavy.

The ClientApp replies at once with new arrays (the received ones plus one); the ServerApp runs Flower's stock
FedAvg (train messages only, like fedvit's merged rounds) over seeded random arrays with the names and shapes of
the run's model, through the same reply polling as fedvit's ServerApp, with Flower's own message layout or with
fedvit's packed ArrayRecords (``floor_settings.json`` beside this file, written by ``deployment_latency.py``), and
writes each round's wall time to ``<out-dir>/<run-name>/floor-rounds.json``. Flower addresses objects by content,
so the arrays must be distinct and new in every message, as fedvit's are: zero arrays share objects, and an
echoed reply re-sends objects the SuperLink already holds (nothing to push), which made an earlier floor cheaper
than any real round.
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

from fedvit.app.polling_grid import PollingGrid, poll_interval
from fedvit.core.wire import wire_mod

SETTINGS_FILE = Path(__file__).with_name("floor_settings.json")  # {"shapes": {name: shape}, "packed": bool}

server = ServerApp()
client = ClientApp(mods=[wire_mod])  # unpacks only what the server packed


@server.main()
def main(grid: Grid, context: Context) -> None:
    rc = context.run_config
    nodes = int(rc["min-nodes"])
    settings = json.loads(SETTINGS_FILE.read_text())
    stamps: list[float] = []
    strategy = FedAvg(fraction_evaluate=0.0, min_train_nodes=nodes, min_available_nodes=nodes)
    rng = np.random.default_rng(0)
    strategy.start(
        grid=PollingGrid(grid, poll_interval(), packed=settings["packed"]),
        initial_arrays=ArrayRecord(
            {name: Array(rng.normal(size=shape).astype(np.float32)) for name, shape in settings["shapes"].items()}
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
    arrays = ArrayRecord({name: Array(a.numpy() + np.float32(1)) for name, a in msg.content["arrays"].items()})
    content = RecordDict({"arrays": arrays, "metrics": MetricRecord({"num-examples": 1})})
    return Message(content, reply_to=msg)
