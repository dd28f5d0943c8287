"""A fedvit run through SecAgg+ (``secagg.enabled``): Flower's legacy ``DefaultWorkflow`` with its
``SecAggPlusWorkflow`` (``fedvit.strategies.secagg``), fedvit's evaluation and round end after each round."""

from __future__ import annotations

from collections.abc import Callable
from logging import INFO

from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.common import ndarrays_to_parameters
from flwr.common.logger import log
from flwr.server import Grid, LegacyContext, ServerConfig
from flwr.server.workflow import DefaultWorkflow

from fedvit.core.config import Config
from fedvit.strategies.base import FedVitStrategy
from fedvit.strategies.secagg import SecAggCentralDP, SecAggFedAvg, current, workflow

RoundEnd = Callable[[int, ArrayRecord], MetricRecord | None]


def run_rounds(
    grid: Grid,
    context: Context,
    config: Config,
    strategy: FedVitStrategy,
    initial: ArrayRecord,
    round_end: RoundEnd,
    num_rounds: int,
) -> tuple[ArrayRecord, SecAggCentralDP | None]:
    """``num_rounds`` rounds of FedAvg through SecAgg+ from ``initial``; returns the final global model and, with
    central DP, the wrapper that released it."""
    names = list(initial.keys())
    strategy.MERGE_EVALUATION = False  # every message of a SecAgg+ round is the protocol's: evaluation goes apart
    settings = config.secagg
    max_weight = settings.max_weight or float(max(info["num-train"] for info in strategy.node_info.values()))
    fedavg = SecAggFedAvg(strategy, grid, names, config.lr, config.accept_failures, settings, max_weight)
    fedavg.initial_parameters = ndarrays_to_parameters([a.numpy() for a in initial.values()])
    driver, dp = fedavg, None
    if config.dp.mode == "central":
        sampled = FedVitStrategy.sample_size(len(strategy.partition_of), strategy.fraction_train)
        driver = dp = SecAggCentralDP(fedavg, config.dp.noise_multiplier, config.dp.clipping_norm, sampled)
    log(INFO, "secagg: SecAgg+ with num-shares %g, reconstruction-threshold %g, clipping-range %g, "
        "quantization-range %d, max-weight %g", settings.num_shares, settings.reconstruction_threshold,
        settings.clipping_range, settings.quantization_range, max_weight)  # fmt: skip

    def after_round(workflow_grid: Grid, legacy: LegacyContext) -> None:
        server_round, arrays = current(legacy, names)
        messages = list(strategy.configure_evaluate(server_round, arrays, ConfigRecord(), workflow_grid))
        if messages:
            replies = workflow_grid.send_and_receive(messages, timeout=config.round_timeout)
            strategy.aggregate_evaluate(server_round, replies)
        round_end(server_round, arrays)

    round_end(0, initial)
    legacy = LegacyContext(context=context, config=ServerConfig(num_rounds=num_rounds), strategy=driver)
    fit = workflow(settings, max_weight, config.round_timeout)
    DefaultWorkflow(fit_workflow=fit, evaluate_workflow=after_round)(grid, legacy)
    return current(legacy, names)[1], dp
