"""fedvit ServerApp: parse the config, build the model, run the strategy, write the outputs."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import asdict
from datetime import datetime
from logging import ERROR, INFO
from pathlib import Path

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp

from fedvit.app import secagg_rounds
from fedvit.app.polling_grid import PollingGrid, poll_interval
from fedvit.capture.writer import CAPTURES, CapturingStrategy, selected
from fedvit.clients.adversarial import robust_accuracy
from fedvit.clients.autoattack import autoattack_accuracy
from fedvit.clients.training import evaluate
from fedvit.core.config import Config, ConfigError, autoattack_in, evaluates_in, parse_config
from fedvit.core.data import DatasetUnavailableError, load_dataset, stratified_subset
from fedvit.core.model import PretrainedWeightsError, build_model, get_weights, resolve_device, set_weights
from fedvit.core.results import RunRecorder, load_checkpoint
from fedvit.strategies import STRATEGIES, FedVitStrategy
from fedvit.strategies.base import ClientSetupError, ClientsFailedError, NodesUnavailableError
from fedvit.strategies.encrypted import ENCRYPTED_STRATEGIES, KeyHandshakeError
from fedvit.strategies.privacy import CentralDP, with_central_dp, write_privacy_report
from fedvit.strategies.secagg import SecAggRoundError

app = ServerApp()

# Failures that are the user's to fix: reported as one line; the run stops (setup errors: before training).
RUN_ERRORS = (
    ConfigError,
    ClientSetupError,
    ClientsFailedError,
    NodesUnavailableError,
    PretrainedWeightsError,
    DatasetUnavailableError,
    KeyHandshakeError,
    SecAggRoundError,
)


def make_strategy(config: Config) -> FedVitStrategy:
    """The configured strategy with the shared sampling/validation settings."""
    common = dict(
        seed=config.seed,
        fraction_train=config.fraction_train,
        fraction_evaluate=config.fraction_evaluate,
        min_nodes=config.min_nodes,
        wait_timeout=config.round_timeout,
        accept_failures=config.accept_failures,
        evaluate_round=lambda rnd: evaluates_in(config, rnd),
        lr_decay=config.lr_decay,
    )
    if config.encryption.enabled:
        strategies, common = ENCRYPTED_STRATEGIES, common | {"encryption_mode": config.encryption.mode}
    else:
        strategies = STRATEGIES
    if config.strategy == "fedsgd":
        return strategies["fedsgd"](lr=config.lr, **common)
    if config.strategy == "masked-fedsgd":
        return strategies["masked-fedsgd"](lr=config.lr, mask=config.mask, **common)
    if config.strategy == "fedwavg":
        return strategies["fedwavg"](q=config.fedwavg.q, last_layer_names=config.fedwavg.last_layer_names, **common)
    if config.strategy == "fedprox":
        return strategies["fedprox"](proximal_mu=config.fedprox.mu, **common)
    if config.strategy == "scaffold":
        return strategies["scaffold"](server_lr=config.scaffold.server_lr, **common)
    return strategies[config.strategy](**common)


def run_dir_for(config: Config) -> Path:
    """Where this run writes; refuses to overwrite another run's results."""
    if config.resume_from and not config.run_name:
        return Path(config.resume_from).expanduser().resolve()
    name = config.run_name or f"{config.strategy}-{datetime.now():%Y%m%d-%H%M%S}"
    path = (Path(config.out_dir).expanduser() / name).resolve()
    resuming_here = config.resume_from and Path(config.resume_from).expanduser().resolve() == path
    if (path / "metrics.json").exists() and not resuming_here:
        raise ConfigError("run-name", name, f"a name not used yet in {path.parent} (or resume-from={path})")
    return path


def _num_classes(strategy: FedVitStrategy) -> int:
    reported = {info["num-classes"] for info in strategy.node_info.values()}
    if not reported:
        raise ClientSetupError("no connected node reported its partition (see the warnings above for each node)")
    if len(reported) != 1:
        raise ClientSetupError(f"clients disagree on the number of classes: {sorted(reported)}")
    return int(reported.pop())


class RoundEnd:
    """Called by ``Strategy.start`` after each round (and before the first): central evaluation,
    the one-line log, metrics.json and the checkpoint."""

    def __init__(self, config: Config, strategy: FedVitStrategy, recorder: RunRecorder, model, total_rounds: int):
        self.config, self.strategy, self.recorder, self.model = config, strategy, recorder, model
        self.total_rounds = total_rounds
        self.test = load_dataset(config.data, config.seed, "test") if config.centralized_evaluation else None
        self.last = time.perf_counter()

    def __call__(self, server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        rnd = self.strategy.round_of(server_round)
        if server_round == 0 and self.strategy.round_offset > 0:
            return None  # resumed: this round was evaluated and logged before the interruption
        weights = {name: a.numpy() for name, a in arrays.items()}
        entry: dict = {"round": rnd}
        central = None
        central_samples = None  # the central AutoAttack subset's size, when there is one
        if self.test is not None and evaluates_in(self.config, rnd):
            set_weights(self.model, weights)
            device = next(self.model.parameters()).device
            img_size = int(self.model.patch_embed.img_size[0])
            loss, acc, _ = evaluate(self.model, self.test, np.arange(len(self.test)), img_size, device)
            central = MetricRecord({"central-loss": loss, "central-accuracy": acc})
            if self.config.robust.enabled:
                central["central-robust-accuracy"] = robust_accuracy(
                    self.model, self.test, np.arange(len(self.test)), img_size, device, self.config.robust,
                    [self.config.seed, rnd, 3], subset_seed=self.config.seed,
                )  # fmt: skip
            if autoattack_in(self.config, rnd):
                robust = self.config.robust
                central["central-autoattack-accuracy"] = autoattack_accuracy(
                    self.model, self.test, np.arange(len(self.test)), img_size, robust,
                    [self.config.seed, rnd, 5], subset_seed=self.config.seed,
                )  # fmt: skip
                central_samples = len(stratified_subset(self.test.labels, np.arange(len(self.test)),
                                                        robust.max_samples, self.config.seed))  # fmt: skip
            entry |= dict(central)
        if autoattack_in(self.config, rnd):  # what the central and the clients' numbers mean, beside them
            robust = self.config.robust
            entry["autoattack"] = {"version": robust.version, "norm": "Linf", "eps-255": robust.eps_255,
                                   "samples": central_samples,
                                   "client-max-samples": robust.max_samples}  # fmt: skip
        self._amend_merged_evaluation(rnd - 1)
        stats = self.strategy.stats.get(rnd)
        if stats is not None:
            entry |= {k: v for k, v in stats.train.items()} | {k: v for k, v in stats.evaluate.items()}
            entry |= {k.replace("_", "-"): v for k, v in asdict(stats).items()
                      if k not in ("train", "evaluate") and v is not None}  # fmt: skip
            if not entry["aggregation"]:
                del entry["aggregation"]
        now = time.perf_counter()
        entry["round-s"] = now - self.last
        self.last = now
        self.recorder.record_round(entry)
        self._log(entry)
        if rnd > 0:
            self.recorder.checkpoint(rnd, weights, self.strategy.state_dict())
        return central

    def _amend_merged_evaluation(self, evaluated_round: int) -> None:
        """Round ``evaluated_round``'s federated evaluation came with this round's train replies: add it to that
        round's entry (the same keys a separate evaluate message gives)."""
        stats = self.strategy.stats.get(evaluated_round)
        if not self.strategy.merges_evaluation(evaluated_round) or stats is None or not stats.evaluate:
            return
        self.recorder.amend_round(evaluated_round, dict(stats.evaluate) | {"rejected": stats.rejected})
        if "eval-accuracy" in stats.evaluate:
            log(
                INFO,
                "round %d/%d | clients' evaluation (sent with round %d): loss %.4f acc %5.1f%%",
                evaluated_round, self.total_rounds, evaluated_round + 1,
                stats.evaluate["eval-loss"], 100 * stats.evaluate["eval-accuracy"],
            )  # fmt: skip

    def _log(self, e: dict) -> None:
        source = next((p for p in ("central", "eval", "train") if f"{p}-accuracy" in e), None)
        quality = (
            f"loss {e[f'{source}-loss']:.4f} acc {100 * e[f'{source}-accuracy']:5.1f}% ({source})"
            if source
            else "no metrics"
        )
        if source and f"{source}-robust-accuracy" in e:
            quality += f" robust {100 * e[f'{source}-robust-accuracy']:5.1f}%"
        if source and f"{source}-autoattack-accuracy" in e:
            quality += f" autoattack {100 * e[f'{source}-autoattack-accuracy']:5.1f}%"
        # SecAgg+'s masked vectors are not counted (``RoundStats.bytes_up`` None)
        up = "not measured" if "bytes-down" in e and "bytes-up" not in e else f"{e.get('bytes-up', 0) / 1e6:.2f} MB"
        log(
            INFO,
            "round %d/%d | %s | %.2f s | up %s down %.2f MB",
            e["round"],
            self.total_rounds,
            quality,
            e["round-s"],
            up,
            e.get("bytes-down", 0) / 1e6,
        )


def run(grid: Grid, context: Context) -> Path:
    """The whole run; returns the output directory."""
    config = parse_config(context.run_config)
    run_dir = run_dir_for(config)
    strategy = make_strategy(config)
    done, history, state = 0, [], {}
    if config.resume_from:
        done, checkpoint_weights, state, history = load_checkpoint(Path(config.resume_from).expanduser(), config)
        if done >= config.num_server_rounds:
            raise ConfigError("num-server-rounds", config.num_server_rounds, f"more than the {done} rounds done")
    connected = strategy.discover(grid)
    # A resumed run takes its weights from the checkpoint: no need to fetch pretrained ones again.
    model_config = dataclasses.replace(config.model, pretrained="off") if config.resume_from else config.model
    model = build_model(model_config, _num_classes(strategy), config.seed).to(resolve_device(config.device))
    if config.resume_from:
        set_weights(model, checkpoint_weights)
        strategy.load_state_dict(state)
        strategy.round_offset = done
    log(INFO, "fedvit: %s on %d node(s); outputs in %s", config.strategy, len(strategy.node_info), run_dir)
    recorder = RunRecorder(run_dir, config, history)
    round_end = RoundEnd(config, strategy, recorder, model, config.num_server_rounds)
    initial = ArrayRecord({k: Array(v) for k, v in get_weights(model).items()})
    initial = strategy.prepare_initial(grid, initial, resumed=bool(config.resume_from))
    strategy.plan_rounds(config.num_server_rounds - done)  # whoever drives the rounds, the strategy knows the last
    if config.secagg.enabled:
        final, dp_driver = secure_rounds(grid, context, config, strategy, initial, round_end, run_dir)
    else:
        final, dp_driver = message_api_rounds(grid, context, config, strategy, initial, round_end, run_dir, connected)
    recorder.finish({k: a.numpy() for k, a in final.items()} or get_weights(model))
    strategy.write_report(run_dir)
    if isinstance(dp_driver, CentralDP):  # the accountant's ε, and the canaries' estimate beside it
        dp_driver.privacy_report(final, run_dir)
    elif dp_driver is not None:
        write_privacy_report(run_dir, config.dp, dp_driver.num_sampled_clients, dp_driver.releases)
    if config.capture.enabled:
        captured = sum(f.stat().st_size for f in run_dir.glob(f"run-*/{CAPTURES}/**/*") if f.is_file())
        log(INFO, "capture: %.1f MB of captures under %s", captured / 1e6, run_dir)
    log(INFO, "fedvit: finished; results in %s", run_dir)
    return run_dir


def message_api_rounds(grid, context, config, strategy, initial, round_end, run_dir, connected):
    """The rounds through Flower's Message API: the strategy (in Flower's DP wrapper with central DP), recorded by
    ``CapturingStrategy`` with capture on. Returns the final model and the DP wrapper (or None)."""
    driver = dp_driver = with_central_dp(strategy, config.dp, len(connected))  # Flower's DP wrapper (central)
    if config.capture.enabled:  # the server's view, recorded around whatever drives the rounds
        driver = CapturingStrategy(driver, run_dir, context.run_config, capture_selection(config, strategy))
        log(INFO, "capture: recording to %s", run_dir)
    result = driver.start(
        grid=grid,
        initial_arrays=initial,
        num_rounds=config.num_server_rounds - strategy.round_offset,
        timeout=config.round_timeout,
        train_config=ConfigRecord({"lr": config.lr}),
        evaluate_config=ConfigRecord(),
        evaluate_fn=round_end,
    )
    final = result.arrays if result.arrays is not None else ArrayRecord()
    return final, dp_driver if isinstance(dp_driver, CentralDP) else None


def secure_rounds(grid, context, config, strategy, initial, round_end, run_dir):
    """The rounds through SecAgg+ (Flower's legacy workflow, ``fedvit.app.secagg_rounds``)."""
    if config.capture.enabled:
        log(INFO, "capture: SecAgg+ runs in Flower's legacy workflow, which the server-side capture cannot wrap; the "
            "clients' capture_mod records every stage of every round to %s", run_dir)  # fmt: skip
    return secagg_rounds.run_rounds(grid, context, config, strategy, initial, round_end, config.num_server_rounds)


def capture_selection(config: Config, strategy: FedVitStrategy) -> Callable[[int, int], bool]:
    """Which (round, node) exchanges the server records: ``capture.rounds`` and ``capture.partitions``."""
    return lambda server_round, node: selected(config, server_round, strategy.partition_of.get(node, -1))


class RunAborted(RuntimeError):
    """Raised so that Flower marks the run ``finished:failed`` (SystemExit would read as completed)."""


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Entry point for ``flwr run``."""
    try:
        run(PollingGrid(grid, poll_interval()), context)
    except RUN_ERRORS as err:
        log(ERROR, "%s", err)
        raise RunAborted(str(err)) from None
