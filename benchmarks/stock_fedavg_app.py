"""Baseline ServerApp for benchmarks: Flower's stock FedAvg driving fedvit's unchanged ClientApp."""

from __future__ import annotations

import json
import time
from pathlib import Path

from flwr.app import Array, ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from fedvit.core.config import parse_config
from fedvit.core.model import build_model, get_weights

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run stock FedAvg; write the wall time of every round to ``<out-dir>/<run-name>/stock-rounds.json``."""
    config = parse_config(context.run_config)
    model = build_model(config.model, config.data.synthetic_num_classes, config.seed)
    stamps: list[float] = []

    def round_end(server_round: int, arrays: ArrayRecord) -> None:
        stamps.append(time.perf_counter())

    strategy = FedAvg(
        fraction_train=config.fraction_train,
        fraction_evaluate=0.0,
        min_train_nodes=config.min_nodes,
        min_available_nodes=config.min_nodes,
    )
    strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord({k: Array(v) for k, v in get_weights(model).items()}),
        num_rounds=config.num_server_rounds,
        timeout=config.round_timeout,
        train_config=ConfigRecord({"lr": config.lr}),
        evaluate_fn=round_end,
    )
    out = Path(config.out_dir) / config.run_name
    out.mkdir(parents=True, exist_ok=True)
    rounds = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
    (out / "stock-rounds.json").write_text(json.dumps({"round-s": rounds}))
