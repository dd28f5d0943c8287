"""SecAgg+ (Bell et al., "Secure Single-Server Aggregation with (Poly)Logarithmic Overhead", CCS 2020) for fedvit's
FedAvg-type runs, through Flower's own ``SecAggPlusWorkflow``: Flower's code, not a reimplementation.

Flower 1.41/1.42 offer SecAgg+ only in the legacy API, so the rounds run in Flower's ``DefaultWorkflow`` with a
legacy FedAvg (:class:`SecAggFedAvg`) that samples, configures and accounts as fedvit's strategies do. Each client
sends its weighted model clipped, quantised and masked; the server learns the weighted mean alone, within the
quantisation error. A round whose clients drop below the reconstruction threshold stops the run
(:class:`StrictSecAggPlusWorkflow`) instead of silently keeping the old model, as Flower's workflow would.
"""

from __future__ import annotations

import json
import time
from logging import INFO, WARNING

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord
from flwr.common import EvaluateIns, FitIns, FitRes, Parameters, Scalar, parameters_to_ndarrays
from flwr.common.logger import log
from flwr.compat.common.recorddict_compat import arrayrecord_to_parameters
from flwr.server import Grid, LegacyContext
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import DifferentialPrivacyClientSideFixedClipping
from flwr.server.strategy import FedAvg as LegacyFedAvg
from flwr.server.workflow import SecAggPlusWorkflow
from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD, Key
from flwr.server.workflow.secure_aggregation.secaggplus_workflow import WorkflowState
from flwr.supercore.differential_privacy import compute_stdv

from fedvit.core.config import SecAggConfig, flower_share_setting
from fedvit.core.secagg import ARRAY_NAMES, CLIPPED_METRIC
from fedvit.strategies.base import (
    ClientsFailedError,
    FedVitStrategy,
    RoundStats,
    error_summary,
    weighted_metric_records,
)

DROPPED = "dropped out of SecAgg+ (no reply at one of its stages)"
BOUND_METRIC = "secagg-error-bound"  # per round: the most an entry of the aggregate may differ from FedAvg's


class SecAggRoundError(RuntimeError):
    """A SecAgg+ round could not be completed (too few clients answered): the run stops, naming the stage."""


class StrictSecAggPlusWorkflow(SecAggPlusWorkflow):
    """Flower's ``SecAggPlusWorkflow``, except that a stage that halts the protocol raises
    :class:`SecAggRoundError` (Flower logs "halted" and the round keeps the old model), and that a client lost
    before its key shares went out is not treated as a dropout whose masks must be removed (below)."""

    def share_keys_stage(self, grid: Grid, context: LegacyContext, state: WorkflowState) -> bool:
        """Flower's stage; then the clients that did not answer it leave the round's sampled set.

        Only the clients that answered this stage had their key shares forwarded, and only they enter each other's
        pairwise masks. Flower 1.41/1.42 keep a client lost here (or at setup) among the sampled ones, so its unmask
        stage asks the survivors for the lost client's key shares, which they never received: every survivor's
        ``secaggplus_mod`` raises ``KeyError`` and the round fails, whatever the threshold (measured over loopback,
        a SuperNode killed after computing its shares). Such a client masked nothing: there is nothing to remove."""
        if not super().share_keys_stage(grid, context, state):
            return False
        state.sampled_node_ids = set(state.active_node_ids)
        return True

    def __call__(self, grid: Grid, context: LegacyContext) -> None:
        state = WorkflowState()
        log(INFO, "Secure aggregation commencing.")
        for stage in (self.setup_stage, self.share_keys_stage, self.collect_masked_vectors_stage, self.unmask_stage):
            if not stage(grid, context, state):
                raise SecAggRoundError(halted(stage.__name__, context, state))
        log(INFO, "Secure aggregation completed.")


def halted(stage: str, context: LegacyContext, state: WorkflowState) -> str:
    """Why Flower's workflow stopped a round, in one line."""
    server_round = context.state.config_records[MAIN_CONFIGS_RECORD][Key.CURRENT_ROUND]
    stage = stage.removesuffix("_stage").replace("_", " ")
    sampled = len(state.nid_to_proxies)  # set at setup; the sampled set shrinks after share keys
    if sampled < 2:
        return f"SecAgg+ round {server_round}: {sampled} client(s) sampled; the protocol needs at least 2"
    why = (f"SecAgg+ round {server_round} stopped at its {stage} stage: {len(state.active_node_ids)} of {sampled} "
           f"sampled clients still answer, fewer than the {state.threshold} share holders (reconstruction threshold) "
           f"each client needs answering to unmask the sum")  # fmt: skip
    if state.failures:  # what the clients that failed said (an error reply), not only that they are gone
        first = state.failures[0].args[0] if state.failures[0].args else state.failures[0]
        why += f"; {len(state.failures)} failed, e.g. {error_summary(getattr(first, 'reason', str(first)))}"
    return why


def workflow(settings: SecAggConfig, max_weight: float, timeout: float) -> StrictSecAggPlusWorkflow:
    """Flower's SecAgg+ workflow with the run's settings (``secagg.*``)."""
    return StrictSecAggPlusWorkflow(
        num_shares=flower_share_setting(settings.num_shares),
        reconstruction_threshold=flower_share_setting(settings.reconstruction_threshold),
        max_weight=max_weight,
        clipping_range=settings.clipping_range,
        quantization_range=settings.quantization_range,
        timeout=timeout,
    )


def quantisation_bound(settings: SecAggConfig, examples: list[int], max_weight: float) -> float:
    """The most an entry of SecAgg+'s weighted mean can differ from FedAvg's over the same client models (entries
    within ±clipping-range). Each client scales its model by r_i = n_i / max-weight (r_i itself quantised to
    quantization-range levels) and rounds it stochastically to a step δ = 2·clipping-range / quantization-range
    (Flower's ``quantize``), so the unmasked sum is off by less than N·δ and the mean by less than N·δ / Σ r_i."""
    levels = settings.quantization_range
    ratios = [round(n / max_weight * levels) / levels for n in examples]
    return len(examples) * 2 * settings.clipping_range / levels / sum(ratios)


class SecAggFedAvg(LegacyFedAvg):
    """Flower's legacy FedAvg as SecAgg+ needs it, sampling and configuring like ``fedvit`` (its strategy's seeded
    sampling by partition and round config, the model's array names for the clients) and keeping that strategy's
    per-round accounting. Federated evaluation is fedvit's own (Message API), outside this class."""

    def __init__(self, fedvit: FedVitStrategy, grid: Grid, names: list[str], lr: float, accept_failures: bool,
                 settings: SecAggConfig, max_weight: float):  # fmt: skip
        super().__init__(fraction_fit=fedvit.fraction_train, accept_failures=accept_failures,
                         fit_metrics_aggregation_fn=lambda _replies: {})  # fedvit's accounting does it: `account`
        self.fedvit, self.grid, self.names, self.lr = fedvit, grid, names, lr
        self.settings, self.max_weight = settings, max_weight
        self.sampled: dict[int, list[int]] = {}  # run round -> node ids
        self._started = 0.0  # when the round's first stage was configured

    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        rnd = self.fedvit.round_of(server_round)
        self._started = time.perf_counter()
        nodes = self.fedvit.sample(self.grid, rnd, self.fedvit.fraction_train, stream=0)
        proxies = {proxy.node_id: proxy for proxy in client_manager.all().values()}
        missing = [n for n in nodes if n not in proxies]
        if missing:
            log(WARNING, "round %d: node(s) %s not yet registered with Flower's legacy workflow; not sampled",
                rnd, missing)  # fmt: skip
        nodes = [n for n in nodes if n in proxies]
        self.sampled[rnd] = nodes
        stats = self.fedvit.stats.setdefault(rnd, RoundStats())
        stats.sampled = [self.fedvit.partition_of[n] for n in nodes]
        stats.messages += 4 * len(nodes)  # the four SecAgg+ stages
        stats.bytes_down += sum(len(t) for t in parameters.tensors) * len(nodes)
        config = ConfigRecord({"server-round": rnd, "lr": self.fedvit.decayed_lr(self.lr, rnd)})
        config = dict(self.fedvit.train_config(rnd, config))
        config[ARRAY_NAMES] = json.dumps(self.names)  # the legacy API's config holds scalars only
        log(INFO, "configure_train: round %d, partitions %s (SecAgg+)", rnd, stats.sampled)
        return [(proxies[n], FitIns(parameters, dict(config))) for n in nodes]

    def aggregate_fit(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        """Flower's FedAvg of the unmasked mean (every result carries it), with the round's accounting."""
        rnd = self.fedvit.round_of(server_round)
        stats = self.fedvit.stats[rnd]
        account(self.fedvit, rnd, self.sampled.get(rnd, []), results)
        if results:
            examples = [res.num_examples for _, res in results]
            stats.train[BOUND_METRIC] = quantisation_bound(self.settings, examples, self.max_weight)
        if not self.accept_failures and stats.rejected:
            raise ClientsFailedError(
                f"round {rnd}: {len(results)} of {len(stats.sampled)} sampled clients completed SecAgg+ and "
                f"accept-failures=false ({len(stats.rejected)} {DROPPED})"
            )
        parameters, _ = super().aggregate_fit(server_round, results, failures)
        stats.train_s = time.perf_counter() - self._started
        return parameters, dict(stats.train)

    def configure_evaluate(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, EvaluateIns]]:
        return []  # fedvit evaluates through the Message API after each round

    def evaluate(self, server_round: int, parameters: Parameters) -> tuple[float, dict[str, Scalar]] | None:
        return None  # fedvit's round end evaluates centrally, after each round


def account(fedvit: FedVitStrategy, rnd: int, sampled: list[int], results: list[tuple[ClientProxy, FitRes]]) -> None:
    """The round's accounting in ``fedvit.stats``: who made the aggregate, who dropped out, the clients' metrics
    (weighted by num-examples, as they reached the server beside the masked vectors)."""
    stats = fedvit.stats[rnd]
    stats.bytes_up = None  # the masked vectors travel in config records the legacy API does not hand over
    done = {proxy.node_id for proxy, _ in results}
    stats.aggregated = sorted(fedvit.partition_of[n] for n in done)
    for node in sampled:
        if node not in done:
            stats.rejected[fedvit.partition_of[node]] = DROPPED
            log(WARNING, "round %d train: partition %d %s", rnd, fedvit.partition_of[node], DROPPED)
    if results:
        stats.train = dict(weighted_metric_records([MetricRecord(dict(res.metrics)) for _, res in results]))
        clipped = stats.train[CLIPPED_METRIC] = sum(int(res.metrics.get(CLIPPED_METRIC, 0)) for _, res in results)
        if clipped:
            log(WARNING, "round %d: SecAgg+ clipped %d entries of the clients' weighted models to "
                "±secagg.clipping-range: the aggregate differs from FedAvg's there", rnd, clipped)  # fmt: skip


class SecAggCentralDP(DifferentialPrivacyClientSideFixedClipping):
    """Flower's legacy central-DP wrapper (client-side fixed clipping) around :class:`SecAggFedAvg`, as Flower's
    SecAgg+ with DP example composes them: the clients clip before masking, the server noises the unmasked sum."""

    strategy: SecAggFedAvg

    def __init__(self, strategy: SecAggFedAvg, noise_multiplier: float, clipping_norm: float, sampled: int):
        super().__init__(strategy, noise_multiplier, clipping_norm, sampled)
        self.releases = 0

    def aggregate_fit(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        parameters, metrics = super().aggregate_fit(server_round, results, failures)
        fedvit, rnd = self.strategy.fedvit, self.strategy.fedvit.round_of(server_round)
        if parameters is None:  # Flower's wrapper releases nothing for a round with a failure
            account(fedvit, rnd, self.strategy.sampled.get(rnd, []), results)
            log(WARNING, "round %d: central DP: a sampled client failed, no release; the global model is unchanged",
                rnd)  # fmt: skip
            return parameters, metrics
        self.releases += 1
        fedvit.stats[rnd].train["dp-central-noise-std"] = compute_stdv(
            self.noise_multiplier, self.clipping_norm, self.num_sampled_clients
        )
        return parameters, metrics


def named(record: ArrayRecord, names: list[str]) -> ArrayRecord:
    """The legacy workflow's model (unnamed arrays, as aggregated) as fedvit's named float32 ArrayRecord."""
    arrays = parameters_to_ndarrays(arrayrecord_to_parameters(record, keep_input=True))
    if len(arrays) != len(names):
        raise ValueError(f"the legacy workflow's model has {len(arrays)} arrays, the model {len(names)}")
    return ArrayRecord({n: Array(np.asarray(a, dtype=np.float32)) for n, a in zip(names, arrays, strict=True)})


def current(context: LegacyContext, names: list[str]) -> tuple[int, ArrayRecord]:
    """(Flower's round counter, the global model) of a legacy workflow's context."""
    return int(context.state.config_records[MAIN_CONFIGS_RECORD][Key.CURRENT_ROUND]), named(
        context.state.array_records[MAIN_PARAMS_RECORD], names
    )
