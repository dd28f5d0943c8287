"""Shared strategy base: seeded sampling by partition id, reply validation, sorted replies, accounting."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from logging import INFO, WARNING

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg

WAIT_POLL_S = 1.0


class NodesUnavailableError(RuntimeError):
    """Fewer nodes than ``min-nodes`` connected within the timeout."""


class ClientsFailedError(RuntimeError):
    """Every sampled client failed in a round: continuing would only repeat the failure."""


class ClientSetupError(RuntimeError):
    """A client reported that it cannot train with this config (e.g. a bad partitioning)."""


@dataclass
class RoundStats:
    """Per-round accounting kept by the strategy (merged into metrics.json by the server app)."""

    bytes_down: int = 0
    bytes_up: int | None = 0  # None: not measured (SecAgg+)
    train_s: float = 0.0
    evaluate_s: float = 0.0
    messages: int = 0  # instructions sent to clients in this round (train + evaluate)
    sampled: list[int] = field(default_factory=list)  # partition ids
    aggregated: list[int] = field(default_factory=list)  # partition ids whose train replies made the new model
    rejected: dict[int, str] = field(default_factory=dict)  # partition id (or -node id) -> reason
    train: dict[str, float] = field(default_factory=dict)  # aggregated client train metrics
    evaluate: dict[str, float] = field(default_factory=dict)  # aggregated client evaluation metrics
    aggregation: dict = field(default_factory=dict)  # strategy-specific, e.g. FedWAvg's weights per partition


def array_bytes(record: RecordDict) -> int:
    """Payload bytes of all ArrayRecords in a message's content."""
    return sum(rec.count_bytes() for rec in record.array_records.values())


def check_arrays(arrays: ArrayRecord, expected: dict[str, tuple[int, ...]]) -> str | None:
    """Why ``arrays`` does not match the expected names/shapes or is not finite float32; None if it does."""
    names = set(arrays.keys())
    if names != set(expected):
        missing, extra = sorted(set(expected) - names), sorted(names - set(expected))
        return f"array names differ from the model's (missing {missing[:3]}, unexpected {extra[:3]})"
    for name, shape in expected.items():
        array = arrays[name]
        if tuple(array.shape) != tuple(shape):
            return f"{name}: shape {tuple(array.shape)} != {tuple(shape)}"
        if array.dtype != "float32":
            return f"{name}: dtype {array.dtype} is not float32"
        if not np.isfinite(array.numpy()).all():
            return f"{name}: contains NaN or Inf"
    return None


def check_metrics(content: RecordDict, record: str = "metrics") -> str | None:
    """Why a reply's metrics are unusable; None if they carry a positive integer ``num-examples``."""
    metrics = content.metric_records.get(record)
    if metrics is None:
        return f"no {record!r} MetricRecord"
    n = metrics.get("num-examples")
    if not isinstance(n, int) or n <= 0:
        return f"num-examples={n!r} is not a positive integer"
    return None


def error_summary(reason: str | None, limit: int = 300) -> str:
    """The informative part of a client error: the exception line that ends its traceback."""
    lines = [line.strip() for line in (reason or "").splitlines() if line.strip()]
    return (lines[-1] if lines else "no reason given")[:limit]


def weighted_metrics(replies: list[Message]) -> MetricRecord:
    """Weighted mean (by num-examples) of every scalar metric of the replies' "metrics" records."""
    return weighted_metric_records([r.content["metrics"] for r in replies])


def weighted_metric_records(records: list[MetricRecord]) -> MetricRecord:
    """Weighted mean (by num-examples) of every scalar metric; compute time summed and maxed."""
    weights = np.array([m["num-examples"] for m in records], dtype=np.float64)
    weights /= weights.sum()
    out: dict[str, float | int] = {"num-examples": int(sum(m["num-examples"] for m in records))}
    keys = set.intersection(*(set(m.keys()) for m in records)) - {"num-examples", "partition-id"}
    for key in sorted(keys):
        values = np.array([float(m[key]) for m in records])
        if key == "compute-s":
            out["compute-s-sum"] = float(values.sum())
            out["compute-s-max"] = float(values.max())
        else:
            out[key] = float(np.dot(weights, values))
    return MetricRecord(out)


DISCOVERY_FIELDS = ("partition-id", "num-partitions", "num-classes")  # what the server reads from a reply


def check_discovery_reply(info: dict) -> str | None:
    """Why a discovery reply (``fedvit.clients.runner.describe``) is unusable, or None."""
    missing = [key for key in DISCOVERY_FIELDS if key not in info]
    if missing:
        return f"lacks {missing} (has {sorted(info)})"
    if not all(isinstance(info[key], int) and not isinstance(info[key], bool) for key in DISCOVERY_FIELDS):
        return f"has non-integer fields ({ {key: info[key] for key in DISCOVERY_FIELDS} })"
    if not 0 <= info["partition-id"] < info["num-partitions"] or info["num-classes"] < 1:
        return f"has partition-id {info['partition-id']} of {info['num-partitions']}, {info['num-classes']} classes"
    return None


class FedVitStrategy(FedAvg):
    """Base for fedvit's strategies; subclasses implement :meth:`aggregate_arrays`.

    Sampling draws from a private generator seeded by (seed, round), over nodes
    ordered by partition id, so runs are reproducible and independent of node ids.
    Replies are validated and sorted by partition id before aggregation.
    """

    # One message per client per round: federated evaluation of round r's model rides on round r+1's train
    # message (the client evaluates what it received, then trains). Only when train and evaluate would reach the
    # same clients (both fractions 1); the last round evaluates with its own message.
    MERGE_EVALUATION = True
    EVALUATE_RECORD = "evaluate-metrics"  # the MetricRecord of a merged reply holding the evaluation

    def __init__(
        self,
        *,
        seed: int = 0,
        fraction_train: float = 1.0,
        fraction_evaluate: float = 1.0,
        min_nodes: int = 2,
        wait_timeout: float = 600.0,
        accept_failures: bool = True,
        evaluate_round: Callable[[int], bool] = lambda _round: True,
        lr_decay: float = 0.0,
    ) -> None:
        super().__init__(
            fraction_train=fraction_train,
            fraction_evaluate=fraction_evaluate,
            min_train_nodes=1,
            min_evaluate_nodes=1,
            min_available_nodes=min_nodes,
        )
        self.seed = seed
        self.lr_decay = lr_decay  # clients' lr in round t: lr · (1 − lr_decay)^(t − 1)
        self.wait_timeout = wait_timeout
        self.accept_failures = accept_failures  # False: a round with a failed/rejected train reply stops the run
        self.evaluate_round = evaluate_round  # whether federated evaluation runs in a given round
        self.round_offset = 0  # rounds already done before a resumed start()
        self.partition_of: dict[int, int] = {}  # node id -> partition id
        self.node_info: dict[int, dict] = {}  # node id -> what the node reported at discovery (well-formed)
        self.excluded: dict[int, str] = {}  # node id -> why its discovery reply was rejected (for the run)
        self.refused: dict[int, int] = {}  # node id -> the node that holds the partition id it claims
        self.stats: dict[int, RoundStats] = {}
        self.global_arrays: ArrayRecord | None = None
        self._expected: dict[str, tuple[int, ...]] = {}
        self._outbox: list[Message] = []  # this round's instructions (Flower sets their ids when pushing them)
        self._t_train = self._t_eval = 0.0
        self.last_round = 0  # the run's final round, set by start()

    def start(self, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int = 3, **kwargs):
        """Flower's ``Strategy.start`` after :meth:`plan_rounds`."""
        self.plan_rounds(num_rounds)
        return super().start(grid, initial_arrays, num_rounds, **kwargs)

    def plan_rounds(self, num_rounds: int) -> None:
        """Remember the run's final round (merged evaluation needs to know it); whoever drives the rounds calls it."""
        self.last_round = self.round_offset + num_rounds

    def merges_evaluation(self, server_round: int) -> bool:
        """Whether round ``server_round``'s federated evaluation rides on the next round's train message."""
        return (
            self.MERGE_EVALUATION
            and self.fraction_train == self.fraction_evaluate == 1.0
            and 1 <= server_round < self.last_round
            and self.evaluate_round(server_round)
        )

    # ------------------------------------------------------------------ sampling

    def discover(self, grid: Grid) -> dict[int, int]:
        """Wait for ``min_available_nodes`` and learn the partition id of every new node (one query each).

        Returns node id -> partition id for the connected nodes that hold a partition. A node whose reply lacks
        the expected fields is logged and excluded for the run. A node claiming a partition id that a connected
        node already holds is refused by name and not sampled (the earlier node keeps it); it takes the
        partition over only once that node has left (e.g. a SuperNode restarted under a new node id).
        """
        deadline = time.monotonic() + self.wait_timeout
        while len(nodes := sorted(grid.get_node_ids())) < self.min_available_nodes:
            if time.monotonic() > deadline:
                raise NodesUnavailableError(
                    f"only {len(nodes)} node(s) connected after {self.wait_timeout:.0f} s; "
                    f"min-nodes={self.min_available_nodes}"
                )
            log(INFO, "Waiting for nodes: %d connected, %d required", len(nodes), self.min_available_nodes)
            time.sleep(WAIT_POLL_S)
        new = [n for n in nodes if n not in self.node_info and n not in self.excluded]
        if new:
            query = RecordDict({"config": ConfigRecord({"ask": "partition-id"})})
            messages = [Message(query, dst_node_id=n, message_type=MessageType.QUERY) for n in new]
            for reply in grid.send_and_receive(messages, timeout=self.wait_timeout):
                node = reply.metadata.src_node_id
                if reply.has_error():
                    log(WARNING, "node %d did not report its partition: %s", node, reply.error.reason)
                    continue
                info = dict(reply.content["config"]) if "config" in reply.content.config_records else {}
                if "error" in info:
                    raise ClientSetupError(f"partition {info.get('partition-id')}: {info['error']}")
                problem = check_discovery_reply(info)
                if problem is not None:
                    log(WARNING, "node %d excluded: its discovery reply %s", node, problem)
                    self.excluded[node] = problem
                    continue
                self.node_info[node] = info
        self._assign_partitions(set(nodes))
        present = set(nodes)
        return {n: p for n, p in self.partition_of.items() if n in present}

    def _assign_partitions(self, present: set[int]) -> None:
        """Give each connected node its claimed partition unless another connected node holds it (first come)."""
        holder = {p: n for n, p in self.partition_of.items() if n in present}
        for node, info in self.node_info.items():  # in discovery order: the earlier claim wins
            if node not in present or node in self.partition_of:
                continue
            partition = int(info["partition-id"])
            if partition in holder:
                if self.refused.get(node) != holder[partition]:
                    log(
                        WARNING,
                        "node %d refused: partition-id %d is already held by node %d "
                        "(give every SuperNode its own --node-config partition-id)",
                        node, partition, holder[partition],
                    )  # fmt: skip
                    self.refused[node] = holder[partition]
                continue
            for gone in [n for n, p in self.partition_of.items() if p == partition]:
                del self.partition_of[gone]  # a node that left: its partition passes to the new claimant
            if self.refused.pop(node, None) is not None:
                log(INFO, "node %d now holds partition-id %d (its earlier holder left)", node, partition)
            self.partition_of[node] = partition
            holder[partition] = node

    def prepare_initial(self, grid: Grid, arrays: ArrayRecord, resumed: bool = False) -> ArrayRecord:
        """Setup before the first round (e.g. a key handshake); returns the global model to start from."""
        return arrays

    def sample(self, grid: Grid, server_round: int, fraction: float, stream: int) -> list[int]:
        """Node ids for this round, chosen by a generator seeded with (seed, round, stream)."""
        available = self.discover(grid)
        by_partition = sorted(available, key=available.__getitem__)
        count = self.sample_size(len(by_partition), fraction)
        rng = np.random.default_rng([self.seed, server_round, stream])
        chosen = rng.choice(len(by_partition), size=count, replace=False)
        return [by_partition[i] for i in sorted(chosen)]

    @staticmethod
    def sample_size(available: int, fraction: float) -> int:
        """How many of ``available`` nodes a round with ``fraction`` samples (at least one)."""
        return min(available, max(1, math.floor(available * fraction)))

    def round_of(self, server_round: int) -> int:
        """The run's round number (Flower's counter restarts at 1 after a resume)."""
        return server_round + self.round_offset

    # ------------------------------------------------------------------ train

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Send the global model and round config to the sampled nodes (one shared RecordDict)."""
        self._t_train = time.perf_counter()
        rnd = self.round_of(server_round)
        self.global_arrays = arrays
        self._expected = self.expected_reply_arrays(arrays)
        node_ids = self.sample(grid, rnd, self.fraction_train, stream=0)
        stats = self.stats.setdefault(rnd, RoundStats())
        stats.sampled = [self.partition_of[n] for n in node_ids]
        config = ConfigRecord(dict(config))
        config["server-round"] = rnd
        if self.merges_evaluation(rnd - 1):
            config["evaluate-round"] = rnd - 1  # evaluate the received model (round rnd - 1's) before training
        if "lr" in config:
            config["lr"] = self.decayed_lr(float(config["lr"]), rnd)
        content = RecordDict({"arrays": arrays, "config": self.train_config(rnd, config)})
        for name, record in self.extra_train_records(rnd, arrays).items():
            content[name] = record
        stats.bytes_down += array_bytes(content) * len(node_ids)
        stats.messages += len(node_ids)
        log(INFO, "configure_train: round %d, partitions %s", rnd, stats.sampled)
        messages = [
            Message(content, dst_node_id=n, message_type=MessageType.TRAIN, group_id=str(rnd)) for n in node_ids
        ]
        self._outbox = messages
        return messages

    def decayed_lr(self, lr: float, server_round: int) -> float:
        """The clients' lr in ``server_round``: lr · (1 − lr_decay)^(round − 1)."""
        return lr * (1.0 - self.lr_decay) ** (server_round - 1)

    def train_config(self, server_round: int, config: ConfigRecord) -> ConfigRecord:
        """Hook for per-round config values (e.g. FedProx's proximal-mu)."""
        return config

    def extra_train_records(self, server_round: int, arrays: ArrayRecord) -> dict[str, ArrayRecord]:
        """Hook for ArrayRecords sent next to the global model (e.g. SCAFFOLD's server control variate)."""
        return {}

    def expected_reply_arrays(self, arrays: ArrayRecord) -> dict[str, tuple[int, ...]]:
        """Names and shapes a train reply's 'arrays' must have (default: those of the global model)."""
        return {name: tuple(a.shape) for name, a in arrays.items()}

    def validate_train_reply(self, msg: Message) -> str | None:
        """Why a train reply must be rejected, or None. Subclasses add checks for their records."""
        reason = check_metrics(msg.content)
        if reason is None:
            arrays = msg.content.array_records.get("arrays")
            reason = "no 'arrays' ArrayRecord" if arrays is None else check_arrays(arrays, self._expected)
        return reason

    def accept(self, server_round: int, replies: Iterable[Message], kind: str) -> list[Message]:
        """Log and drop error or invalid replies; return the valid ones sorted by partition id."""
        stats = self.stats.setdefault(server_round, RoundStats())
        valid = []
        # An error the SuperLink generated (e.g. code 5, node unavailable) comes from node 1, not from the node
        # that failed: attribute it to the destination of the instruction it answers.
        destination = {m.metadata.message_id: m.metadata.dst_node_id for m in self._outbox}
        for msg in replies:
            node = msg.metadata.src_node_id
            if msg.has_error():
                node = destination.get(msg.metadata.reply_to_message_id, node)
            who = self.partition_of.get(node, -node)
            if msg.has_error():
                reason = f"error {msg.error.code}: {error_summary(msg.error.reason)}"
            else:
                if kind == "train":
                    stats.bytes_up += array_bytes(msg.content)
                reason = self.validate_train_reply(msg) if kind == "train" else check_metrics(msg.content)
            if reason is None:
                valid.append(msg)
            else:
                stats.rejected[who] = reason
                log(WARNING, "round %d %s: rejected reply of partition %s: %s", server_round, kind, who, reason)
        return sorted(valid, key=lambda m: self.partition_of.get(m.metadata.src_node_id, -1))

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Validate, sort and aggregate; keep the global model when no reply is usable."""
        rnd = self.round_of(server_round)
        valid = self._accept_train(rnd, replies)
        result: tuple[ArrayRecord | None, MetricRecord | None] = (None, None)
        if valid:
            result = self.aggregate_arrays(rnd, valid), weighted_metrics(valid)
            self.stats[rnd].train = dict(result[1])
            self.stats[rnd].aggregated = [self.partition_of.get(m.metadata.src_node_id, -1) for m in valid]
        else:
            self._stop_if_all_failed(rnd)
            log(WARNING, "round %d: no valid train replies; the global model is unchanged", rnd)
        self.stats[rnd].train_s = time.perf_counter() - self._t_train
        return result

    def skip_aggregation(self, server_round: int, replies: Iterable[Message], why: str) -> None:
        """The bookkeeping of a round whose replies a wrapper does not let this strategy aggregate (e.g. Flower's
        DP wrapper when a sampled client failed): rejections logged, merged evaluation kept, and the run stopped
        when every client failed."""
        rnd = self.round_of(server_round)
        if not self._accept_train(rnd, replies):
            self._stop_if_all_failed(rnd)
        log(WARNING, "round %d: %s; the global model is unchanged", rnd, why)
        self.stats[rnd].train_s = time.perf_counter() - self._t_train

    def _accept_train(self, rnd: int, replies: Iterable[Message]) -> list[Message]:
        valid = self.accept(rnd, replies, "train")
        if self.merges_evaluation(rnd - 1):
            self.aggregate_merged_evaluation(rnd - 1, valid)
        if not self.accept_failures:
            self._stop_if_any_failed(rnd, len(valid))
        return valid

    def _stop_if_any_failed(self, rnd: int, replied: int) -> None:
        """accept-failures=false (Flower's legacy ``accept_failures``): a round short of any sampled client's
        valid reply is not aggregated; the run stops before it, so a resume redoes the round with everyone."""
        sampled = len(self.stats[rnd].sampled)
        rejected = self.stats[rnd].rejected
        if replied < sampled or rejected:
            why = "; ".join(f"partition {p}: {r}" for p, r in rejected.items()) or "replies missing at the timeout"
            raise ClientsFailedError(
                f"round {rnd}: {replied} of {sampled} sampled clients replied validly and accept-failures=false "
                f"({why}); resume from the last checkpoint once fixed"
            )

    def _stop_if_all_failed(self, rnd: int) -> None:
        rejected = self.stats[rnd].rejected
        if rejected and all(reason.startswith("error") for reason in rejected.values()):
            partition, reason = next(iter(rejected.items()))
            raise ClientsFailedError(
                f"round {rnd}: all {len(rejected)} clients failed (partition {partition}: "
                f"{reason}); resume from the last checkpoint once fixed"
            )

    def aggregate_arrays(self, server_round: int, replies: list[Message]) -> ArrayRecord:
        """Combine valid replies (sorted by partition id) into the new global model."""
        raise NotImplementedError

    def aggregate_merged_evaluation(self, evaluated_round: int, replies: list[Message]) -> None:
        """The evaluation of round ``evaluated_round``'s model from this round's valid train replies."""
        valid, stats = [], self.stats.setdefault(evaluated_round, RoundStats())
        for msg in replies:
            reason = check_metrics(msg.content, self.EVALUATE_RECORD)
            if reason is None:
                valid.append(msg.content[self.EVALUATE_RECORD])
            else:
                who = self.partition_of.get(msg.metadata.src_node_id, -1)
                stats.rejected[who] = f"evaluation: {reason}"
                log(WARNING, "round %d evaluate: rejected reply of partition %s: %s", evaluated_round, who, reason)
        if valid:
            stats.evaluate = dict(weighted_metric_records(valid))

    # ------------------------------------------------------------------ evaluate

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Federated evaluation on the sampled clients' local test splits (unless the next train message does it)."""
        self._t_eval = time.perf_counter()
        rnd = self.round_of(server_round)
        if self.fraction_evaluate == 0.0 or not self.evaluate_round(rnd) or self.merges_evaluation(rnd):
            return []
        node_ids = self.sample(grid, rnd, self.fraction_evaluate, stream=1)
        config = ConfigRecord(dict(config))
        config["server-round"] = rnd
        content = RecordDict({"arrays": arrays, "config": config})
        stats = self.stats.setdefault(rnd, RoundStats())
        stats.bytes_down += array_bytes(content) * len(node_ids)
        stats.messages += len(node_ids)
        self._outbox = [
            Message(content, dst_node_id=n, message_type=MessageType.EVALUATE, group_id=str(rnd)) for n in node_ids
        ]
        return self._outbox

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """Weighted mean of the clients' evaluation metrics."""
        rnd = self.round_of(server_round)
        valid = self.accept(rnd, replies, "evaluate")
        stats = self.stats.setdefault(rnd, RoundStats())
        stats.evaluate_s = time.perf_counter() - self._t_eval
        if not valid:
            return None
        metrics = weighted_metrics(valid)
        stats.evaluate = dict(metrics)
        return metrics

    # ------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict[str, np.ndarray]:
        """Strategy state that a checkpoint must hold to resume bit-identically (none for stateless ones)."""
        return {}

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        """Restore :meth:`state_dict`."""
        if state:
            raise ValueError(f"{type(self).__name__} has no state, got {sorted(state)}")

    def write_report(self, run_dir) -> None:
        """Strategy-specific outputs written at the end of a run (none by default)."""

    def summary(self) -> None:
        log(
            INFO,
            "\t├── %s: seed %d, fraction train %.2f / evaluate %.2f, min nodes %d, accept failures %s",
            type(self).__name__,
            self.seed,
            self.fraction_train,
            self.fraction_evaluate,
            self.min_available_nodes,
            self.accept_failures,
        )
