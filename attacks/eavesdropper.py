"""The eavesdropper: records what crosses the wire, for the attack audit (``fedvit audit``).

Two observers, both read-only (a run with capture on trains bit-identically to one with it off):

- a ClientApp mod (:func:`capture_mod`) that records, per node and round, the message the client received (the
  global model, or the key handshake) and the exact reply it sent: ``captures/round-NNNN/partition-P.*``;
- a server-side tap (:class:`ServerTap`, called by the strategy) for the honest-but-curious server's view: the
  global model it sent each round and every reply it got, errors included: ``captures/server/round-NNNN/``.

Each message becomes ``<stem>.received.safetensors`` / ``<stem>.sent.safetensors`` (ArrayRecords flattened as
``<record>/<name>``) and a ``<stem>.json`` manifest with the public run config, written atomically. With
``capture.ground-truth`` the client's ``on_batch`` hook (:func:`ground_truth_hook`) writes its true batch to
``<run>/ground-truth/`` — never read by attacks.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import Context, Message, RecordDict
from flwr.common.logger import log

from core.config import Config, ConfigError, parse_config_cached, parse_selection
from core.results import atomic_save_safetensors, atomic_write
from core.wire import LAYOUT_RECORD, is_packed, unpack

CAPTURES = "captures"
GROUND_TRUTH = "ground-truth"


def run_dir(config: Config) -> Path:
    """``<out-dir>/<run-name>`` as both sides compute it (capture requires a run name)."""
    return (Path(config.out_dir).expanduser() / config.run_name).resolve()


def round_selected(config: Config, server_round: int) -> bool:
    """Whether round ``server_round`` is captured; round 0 is the setup (discovery, key handshake)."""
    rounds = parse_selection(config.capture.rounds)
    return config.capture.enabled and (rounds is None or server_round in rounds or server_round == 0)


def selected(config: Config, server_round: int, partition_id: int) -> bool:
    """Whether this (round, partition) is captured."""
    partitions = parse_selection(config.capture.partitions)
    return round_selected(config, server_round) and (partitions is None or partition_id in partitions)


def plain_content(msg: Message) -> RecordDict:
    """A message's records, with fedvit's packed ArrayRecords (:mod:`core.wire`) unpacked."""
    return unpack(msg.content) if is_packed(msg.content) else msg.content


def flatten(msg: Message) -> dict[str, np.ndarray]:
    """All ArrayRecords of a message as ``<record>/<name>`` → array (exact copies of the payload)."""
    if not msg.has_content():
        return {}
    return {
        f"{rec}/{name}": arr.numpy()
        for rec, record in plain_content(msg).array_records.items()
        for name, arr in record.items()
    }


def unflatten(arrays: dict[str, np.ndarray]) -> dict[str, dict[str, np.ndarray]]:
    """Inverse of :func:`flatten`: record name → {array name → array}."""
    out: dict[str, dict[str, np.ndarray]] = {}
    for key, value in arrays.items():
        record, _, name = key.partition("/")
        out.setdefault(record, {})[name] = value
    return out


def _records(msg: Message, kind: str) -> dict[str, Any]:
    if not msg.has_content():
        return {"error": msg.error.reason if msg.has_error() else "no content"}
    records = getattr(plain_content(msg), kind)
    return {name: dict(rec.items()) for name, rec in records.items() if name != LAYOUT_RECORD}


def describe(msg: Message, arrays: dict[str, np.ndarray]) -> dict[str, Any]:
    """One direction of a capture manifest: message type, array shapes, ConfigRecords, MetricRecords, error."""
    entry = {
        "message-type": msg.metadata.message_type,
        "arrays": {k: list(v.shape) for k, v in arrays.items()},
        "config": _records(msg, "config_records"),
        "metrics": _records(msg, "metric_records"),
    }
    if msg.has_error():
        entry["error"] = f"{msg.error.code}: {msg.error.reason}"
    return entry


def _has_arrays(msg: Message) -> bool:
    return msg.has_content() and bool(msg.content.array_records)


def write_capture(stem: Path, messages: dict[str, Message], **head: Any) -> int:
    """Save each message's arrays as ``<stem>.<direction>.safetensors`` and one ``<stem>.json`` manifest holding
    ``head`` (round, node, partition, run config, ...) and per direction its records; returns the bytes saved."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    manifest, size = dict(head), 0
    for direction, msg in messages.items():
        arrays = flatten(msg)
        path = stem.with_name(f"{stem.name}.{direction}.safetensors")
        atomic_save_safetensors(path, arrays)
        size += os.path.getsize(path)
        manifest[direction] = describe(msg, arrays)
    atomic_write(stem.with_name(f"{stem.name}.json"), json.dumps(manifest, indent=1, default=str).encode())
    return size


def capture_mod(msg: Message, context: Context, call_next) -> Message:
    """ClientApp mod: pass the message on unchanged, then record it and the reply (train and query messages)."""
    reply = call_next(msg, context)
    try:
        config = parse_config_cached(context.run_config)  # once per process, not per message
    except ConfigError:
        return reply  # the handler has already reported the config error
    if not config.capture.enabled or msg.metadata.message_type not in ("train", "query"):
        return reply
    partition = int(context.node_config.get("partition-id", -1))
    server_round = int(msg.content["config"].get("server-round", 0)) if "config" in msg.content else 0
    if not selected(config, server_round, partition) or not (_has_arrays(msg) or _has_arrays(reply)):
        return reply
    stem = run_dir(config) / CAPTURES / f"round-{server_round:04d}" / f"partition-{partition}"
    if msg.metadata.message_type == "query":
        stem = stem.with_name(f"{stem.name}-handshake")
    size = write_capture(
        stem,
        {"received": msg, "sent": reply},
        round=server_round,
        partition=partition,
        node=context.node_id,
        observer="wire",
        run_config=config.to_dict(),
    )
    log(20, "eavesdropper: captured round %d partition %d (%.2f MB)", server_round, partition, size / 1e6)
    return reply


class ServerTap:
    """The honest-but-curious server's record: the global model sent per round and every reply received."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.root = run_dir(config) / CAPTURES / "server"

    def sent(self, server_round: int, msg: Message, name: str = "global") -> None:
        """The round's global model (one copy; every sampled client got the same one), or the handshake."""
        if round_selected(self.config, server_round):
            stem = self.root / f"round-{server_round:04d}" / name
            head = {"round": server_round, "observer": "server", "run_config": self.config.to_dict()}
            write_capture(stem, {"sent": msg}, **head)

    def received(self, server_round: int, partition: int, msg: Message, name: str = "") -> None:
        """One reply as the server got it (errors included)."""
        if selected(self.config, server_round, partition):
            stem = self.root / f"round-{server_round:04d}" / (name or f"partition-{partition}")
            head = {"round": server_round, "partition": partition, "node": msg.metadata.src_node_id}
            write_capture(stem, {"received": msg}, **head, observer="server", run_config=self.config.to_dict())


def write_ground_truth(config: Config, server_round: int, partition: int, images: np.ndarray, labels: np.ndarray):
    """The client's true batch (audit option ``capture.ground-truth``), kept apart from the captures."""
    path = run_dir(config) / GROUND_TRUTH / f"round-{server_round:04d}" / f"partition-{partition}.safetensors"
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_save_safetensors(path, {"images": images.astype(np.float32), "labels": labels.astype(np.int64)})


def ground_truth_hook(
    config: Config, server_round: int, partition: int
) -> Callable[[np.ndarray, np.ndarray], None] | None:
    """The client's ``on_batch`` hook that writes its true batch, or None when this round is not recorded."""
    if not (config.capture.ground_truth and selected(config, server_round, partition)):
        return None
    return functools.partial(write_ground_truth, config, server_round, partition)
