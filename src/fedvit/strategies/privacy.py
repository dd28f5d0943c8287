"""Central differential privacy (``dp.mode = "central"``) through Flower's own strategy wrapper.

Flower's ``DifferentialPrivacyClientSideFixedClipping`` sends the clipping norm C with every train message (the
clients' ``fixedclipping_mod`` clips to it, ``fedvit.clients.privacy``) and adds N(0, (σ·C/n)²) to the aggregate of the
n sampled clients (``compute_stdv``; McMahan et al. 2018). Here it drives a fedvit strategy: the rounds are
planned by it, and a round it refuses to aggregate (a sampled client failed) is still accounted for. With
``dp.canaries`` = k, k canary clients join every aggregate before the noise (calibrated to the n + k updates) and
the run ends with an empirical ε beside the accountant's (``fedvit.strategies.canaries``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from logging import INFO
from pathlib import Path

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import DifferentialPrivacyClientSideFixedClipping
from flwr.supercore.differential_privacy import compute_stdv

from fedvit.core.config import DPConfig
from fedvit.strategies import canaries
from fedvit.strategies.base import FedVitStrategy

PRIVACY_REPORT = "dp-privacy.json"


class CentralDP(DifferentialPrivacyClientSideFixedClipping):
    """Flower's client-side fixed-clipping DP wrapper around a :class:`FedVitStrategy`."""

    strategy: FedVitStrategy

    def __init__(self, strategy: FedVitStrategy, dp: DPConfig, num_sampled_clients: int) -> None:
        super().__init__(strategy, dp.noise_multiplier, dp.clipping_norm, num_sampled_clients)
        self.dp, self.clients = dp, num_sampled_clients
        self._sent: np.ndarray | None = None  # the global model of the round being trained, flattened
        self._canaries: np.ndarray | None = None  # Σ u_i (computed once)
        self._start: np.ndarray | None = None  # the model the run started from, flattened
        self.releases = 0  # aggregates released (each one Gaussian mechanism)
        self._round = 0  # the server round being aggregated (its clients' count mixes the canaries in)

    @property
    def noised_updates(self) -> int:
        """The updates the noise is calibrated to: every one in the aggregate, the canaries' too."""
        return self.clients + self.dp.canaries

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid):
        if self.dp.canaries:
            self._sent = flat(arrays)
            if self._start is None:
                self._start = self._sent
        return super().configure_train(server_round, arrays, config, grid)

    def _add_noise_to_aggregated_arrays(self, aggregated_arrays: ArrayRecord) -> ArrayRecord:
        """The canaries join the aggregate of the clients Flower's wrapper aggregated, then its noise is added (a
        hook of Flower's wrapper, between its aggregation and its noise; tested on Flower 1.41 and 1.42)."""
        self.releases += 1
        if not self.dp.canaries:
            return super()._add_noise_to_aggregated_arrays(aggregated_arrays)
        if self._canaries is None:
            self._canaries = canaries.canary_sum(len(self._sent), self.dp.canaries, self.strategy.seed)
        clients = len(self.strategy.stats[self.strategy.round_of(self._round)].aggregated)
        mixed = canaries.with_canaries(flat(aggregated_arrays), self._sent, self._canaries, self.clipping_norm,
                                       clients, self.dp.canaries)  # fmt: skip
        # Flower's wrapper checks the replies against the sampled clients alone: the count is raised for the noise only
        self.num_sampled_clients = self.noised_updates
        try:
            return super()._add_noise_to_aggregated_arrays(unflat(mixed, aggregated_arrays))
        finally:
            self.num_sampled_clients = self.clients

    def privacy_report(self, final: ArrayRecord, run_dir: Path) -> dict:
        """The accountant's ε over the released rounds and, with canaries, the one-shot estimate from the run's
        model change; written to ``dp-privacy.json`` and logged."""
        releases = self.strategy.round_offset + self.releases  # a resumed run released its earlier rounds too
        found = {}
        if self.dp.canaries and self._start is not None and len(final):
            found = canaries.estimate(flat(final) - self._start, self.dp.canaries, self.strategy.seed, self.dp.delta)
        report = write_privacy_report(run_dir, self.dp, self.clients, releases, found)
        if found:
            log(INFO, "dp: %d canaries, empirical ε %.3g (one-shot estimate) against the accountant's ε %.3g at δ %g",
                self.dp.canaries, found["epsilon-estimate"], report["accountant-epsilon"], self.dp.delta)
        return report

    def start(self, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int = 3, **kwargs):
        """Flower's ``Strategy.start`` on this wrapper, after the wrapped strategy planned its rounds."""
        self.strategy.plan_rounds(num_rounds)
        return super().start(grid, initial_arrays, num_rounds, **kwargs)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Flower's DP aggregation; its noise std goes into the round's metrics."""
        replies = list(replies)
        self._round = server_round
        if any(m.has_error() for m in replies):  # Flower's wrapper then releases nothing for the round
            self.strategy.skip_aggregation(server_round, replies, "central DP: a sampled client failed, no release")
        arrays, metrics = super().aggregate_train(server_round, replies)
        if arrays is not None:
            std = compute_stdv(self.noise_multiplier, self.clipping_norm, self.noised_updates)
            self.strategy.stats[self.strategy.round_of(server_round)].train["dp-central-noise-std"] = std
        return arrays, metrics


def write_privacy_report(run_dir: Path, dp: DPConfig, clients: int, releases: int, extra: dict | None = None) -> dict:
    """``dp-privacy.json``: the settings, the releases and the accountant's ε over them (with ``extra`` beside)."""
    report = {"noise-multiplier": dp.noise_multiplier, "clipping-norm": dp.clipping_norm,
              "clients-per-round": clients, "releases": releases, "delta": dp.delta,
              "accountant-epsilon": canaries.accountant_epsilon(dp.noise_multiplier, releases, dp.delta)}  # fmt: skip
    report |= extra or {}
    report = {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in report.items()}
    (run_dir / PRIVACY_REPORT).write_text(json.dumps(report, indent=2))
    return report


def with_central_dp(strategy: FedVitStrategy, dp: DPConfig, num_nodes: int) -> FedVitStrategy | CentralDP:
    """What drives the rounds: ``strategy`` itself, or Flower's DP wrapper around it in central mode, calibrated to
    the clients a round samples from ``num_nodes`` connected nodes."""
    if dp.mode != "central":
        return strategy
    return CentralDP(strategy, dp, FedVitStrategy.sample_size(num_nodes, strategy.fraction_train))


def flat(arrays: ArrayRecord) -> np.ndarray:
    """Every array of ``arrays``, in order, as one float64 vector."""
    return np.concatenate([a.numpy().astype(np.float64).ravel() for a in arrays.values()])


def unflat(vector: np.ndarray, like: ArrayRecord) -> ArrayRecord:
    """``vector`` cut back into arrays of ``like``'s names, shapes and dtypes."""
    out, first = {}, 0
    for name, array in like.items():
        value = array.numpy()
        out[name] = Array(vector[first : first + value.size].reshape(value.shape).astype(value.dtype))
        first += value.size
    return ArrayRecord(out)
