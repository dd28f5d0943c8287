"""fedvit ClientApp: marshals Flower records; the work happens in ``fedvit.clients``."""

from __future__ import annotations

import os
import sys
import time
from logging import INFO
from pathlib import Path

from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.logger import log

from fedvit.capture.writer import capture_mod, ground_truth_hook
from fedvit.clients import runner
from fedvit.clients.encryption import EncryptionKey, EncryptionKeyError, require_client_key
from fedvit.clients.privacy import dp_mod
from fedvit.clients.secagg import secagg_mod
from fedvit.core.config import Config
from fedvit.core.wire import wire_mod
from fedvit.strategies.base import FedVitStrategy

REPORT_LAUNCH_ENV = "FEDVIT_REPORT_LAUNCH"  # "1": train replies carry launch-to-handler-s (deployment benchmark)


# The first mod is outermost: the capture records what Flower's DP mod let leave (dp.mode on), as plain records,
# and with secagg.enabled every SecAgg+ stage as it crossed the wire (masked). It only records, and only when
# capture.enabled. secagg_mod runs Flower's secaggplus_mod on SecAgg+ messages, with the DP mod and the handler inside.
MODS = [wire_mod, capture_mod, secagg_mod, dp_mod]
app = ClientApp(mods=MODS)


def _partition(context: Context) -> tuple[int, int]:
    try:
        return int(context.node_config["partition-id"]), int(context.node_config["num-partitions"])
    except KeyError as err:
        raise RuntimeError("this SuperNode needs --node-config 'partition-id=<i> num-partitions=<n>'") from err


def _weights(msg: Message, record: str = "arrays") -> dict:
    return {name: array.numpy() for name, array in msg.content[record].items()}


def _key(config: Config, context: Context) -> EncryptionKey | None:
    """The shared secret, from the client side only (node config or environment), when encryption is on."""
    return require_client_key(dict(context.node_config)) if config.encryption.enabled else None


@app.query()
def query(msg: Message, context: Context) -> Message:
    """Before training: report partition facts (or a config error); with encryption, answer the key handshake."""
    config = runner.client_config(context.run_config)
    if msg.content["config"].get("ask") == "encrypt-initial":
        key = _key(config, context)
        if key is None:
            raise RuntimeError("the server asked for a key handshake but encryption.mode is 'off'")
        encrypted = runner.encrypt_initial(config, key, _weights(msg))
        return Message(RecordDict({"arrays": ArrayRecord({k: Array(v) for k, v in encrypted.items()})}), reply_to=msg)
    info = runner.describe(config, *_partition(context))
    try:
        _key(config, context)  # a missing or unreadable key stops the run before training, naming this node
    except EncryptionKeyError as err:
        info.setdefault("error", str(err))
    return Message(RecordDict({"config": ConfigRecord(info)}), reply_to=msg)


def _process_age_s() -> float:
    """Seconds since this process started (Linux /proc): in deployment a process per task, forked or started
    fresh, so this is the time from the task's launch to the handler."""
    fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    boot = next(
        float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines() if line.startswith("btime")
    )
    return time.time() - (boot + int(fields[19]) / os.sysconf("SC_CLK_TCK"))


def ray_placement() -> str | None:
    """Where this ClientApp runs when the simulation's Ray backend placed it (a Ray worker), else None."""
    ray = sys.modules.get("ray")  # imported by Flower's Ray backend; never imported here
    if ray is None or not ray.is_initialized():
        return None
    return f"Ray node {ray.get_runtime_context().get_node_id()} ({ray.util.get_node_ip_address()}, pid {os.getpid()})"


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Local training for one round; replies with 'arrays' (gradient or weights), 'masks' when masking, 'metrics',
    and 'evaluate-metrics' when the server merged the previous round's evaluation into this message."""
    launch_s = _process_age_s() if os.environ.get(REPORT_LAUNCH_ENV) == "1" else None
    config = runner.client_config(context.run_config)
    round_config = msg.content["config"]
    server_round, partition = int(round_config["server-round"]), _partition(context)
    if placement := ray_placement():  # a simulation on a Ray cluster: say where each client ran
        log(INFO, "round %d, partition %d: on %s", server_round, partition[0], placement)
    mask_seed = context.node_config.get("mask-seed")  # client-only; never in the run config
    locked = context.state.array_records.get("locked-mask")
    locked_cache = {k: v.numpy() for k, v in locked.items()} if locked is not None else {}
    weights, key = _weights(msg), _key(config, context)
    evaluation = None
    if "evaluate-round" in round_config:  # merged message: evaluate the received model first, as @app.evaluate would
        evaluation = runner.evaluate_local(
            config, *partition, weights, key=key, server_round=int(round_config["evaluate-round"])
        )
    records, metrics = runner.train(
        config,
        *partition,
        weights,
        server_round,
        float(round_config.get("lr", config.lr)),
        mask_seed=None if mask_seed is None else int(mask_seed),
        locked_cache=locked_cache,
        key=key,
        proximal_mu=float(round_config.get("proximal-mu", 0.0)),
        server_control=_weights(msg, "control") if "control" in msg.content.array_records else None,
        run_key=config.run_name or f"run-{context.run_id}",
        on_batch=ground_truth_hook(config, server_round, partition[0], context.run_id, context.node_id),
    )
    if locked_cache and locked is None:  # keep the locked masks in the node's state for the next rounds
        context.state["locked-mask"] = ArrayRecord({k: Array(v) for k, v in locked_cache.items()})
    content = RecordDict({name: ArrayRecord({k: Array(v) for k, v in rec.items()}) for name, rec in records.items()})
    if launch_s is not None:
        metrics["launch-to-handler-s"] = launch_s
    content["metrics"] = MetricRecord(metrics)
    if evaluation is not None:
        content[FedVitStrategy.EVALUATE_RECORD] = MetricRecord(evaluation)
    return Message(content, reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Evaluate the global model on this client's test split."""
    config = runner.client_config(context.run_config)
    server_round = int(msg.content["config"].get("server-round", 0)) if "config" in msg.content else 0
    metrics = runner.evaluate_local(
        config, *_partition(context), _weights(msg), key=_key(config, context), server_round=server_round
    )
    return Message(RecordDict({"metrics": MetricRecord(metrics)}), reply_to=msg)
