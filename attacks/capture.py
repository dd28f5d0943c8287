"""Capture for any Flower app: one layout for the wire tap, the ClientApp mod and the server-side wrapper.

Every observer writes ``<dir>/run-<run id>/captures/round-NNNN/node-<node id>[-<type>]``: the manifest
``.json`` and one ``.<direction>.safetensors`` per direction (``received``: what the node got; ``sent``: what it
answered), in the format of :func:`attacks.eavesdropper.write_capture` (fedvit's own app writes the same files
under ``partition-P``). Train messages are named ``node-<id>``; evaluate and query messages carry their type.

The round is the ``server-round`` a ConfigRecord carries (Flower's strategies write it), else a numeric
``group_id``, else the node's count of messages of that type in the run. Nothing here changes a message.
"""

from __future__ import annotations

import json
import os
import re
from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from attacks.eavesdropper import CAPTURES, describe, flatten
from core.results import atomic_save_safetensors, atomic_write

CAPTURE_DIR_KEY = "fedvit-capture-dir"  # run-config key an app may set for capture_mod
CAPTURE_DIR_ENV = "FEDVIT_CAPTURE_DIR"
DEFAULT_CAPTURE_DIR = "fedvit-captures"


def message_round(msg: Message) -> int | None:
    """The server round a message names: a ConfigRecord's ``server-round``, else a numeric ``group_id``."""
    if msg.has_content():
        for record in msg.content.config_records.values():
            if isinstance(record.get("server-round"), int):
                return int(record["server-round"])
    group = msg.metadata.group_id
    return int(group) if group.isdigit() else None


class RoundCounter:
    """Rounds for messages that name none: the n-th message of a type a node received in a run is round n."""

    def __init__(self) -> None:
        self._seen: dict[tuple[int, int, str], int] = defaultdict(int)

    def round_of(self, msg: Message, node: int) -> tuple[int, str]:
        """(round, how it was read) for an instruction ``msg`` that ``node`` received."""
        named = message_round(msg)
        key = (msg.metadata.run_id, node, msg.metadata.message_type)
        self._seen[key] += 1
        if named is not None:
            return named, "server-round"
        return self._seen[key], "message count"


def capture_stem(root: Path, run_id: int, server_round: int, node: int, message_type: str) -> Path:
    """``<root>/run-<run_id>/captures/round-NNNN/node-<node>[-<type>]``."""
    kind = "" if message_type == "train" else "-" + re.sub(r"[^A-Za-z0-9_.-]", "_", message_type)
    return Path(root) / f"run-{run_id}" / CAPTURES / f"round-{server_round:04d}" / f"node-{node}{kind}"


def add_direction(stem: Path, direction: str, msg: Message, **head: Any) -> int:
    """Write one direction of a capture (``<stem>.<direction>.safetensors``) and merge it into ``<stem>.json``
    (created with ``head`` when new); returns the bytes of arrays saved."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    manifest_path = stem.with_name(f"{stem.name}.json")
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    for key, value in head.items():
        manifest.setdefault(key, value)
    arrays = flatten(msg)
    path = stem.with_name(f"{stem.name}.{direction}.safetensors")
    atomic_save_safetensors(path, arrays)
    manifest[direction] = describe(msg, arrays)
    atomic_write(manifest_path, json.dumps(manifest, indent=1, default=str).encode())
    return os.path.getsize(path)


def capture_dir(context: Context) -> Path:
    """Where :func:`capture_mod` writes: the run config's ``fedvit-capture-dir``, else $FEDVIT_CAPTURE_DIR, else
    ``./fedvit-captures`` (absolute, so every ClientApp process of a host writes to one place)."""
    chosen = context.run_config.get(CAPTURE_DIR_KEY) or os.environ.get(CAPTURE_DIR_ENV) or DEFAULT_CAPTURE_DIR
    return Path(str(chosen)).expanduser().resolve()


_client_rounds = RoundCounter()  # per process: a deployment's per-message ClientApp processes need server-round


def capture_mod(msg: Message, context: Context, call_next: Callable[[Message, Context], Message]) -> Message:
    """ClientApp mod for any app (``ClientApp(mods=[capture_mod])``): passes the message on unchanged, then
    records it and the exact reply (train, evaluate and query messages; errors in writing are logged, never
    raised: the client's work is not disturbed)."""
    reply = call_next(msg, context)
    try:
        node = context.node_id
        server_round, source = _client_rounds.round_of(msg, node)
        stem = capture_stem(capture_dir(context), msg.metadata.run_id, server_round, node, msg.metadata.message_type)
        head = {
            "run-id": msg.metadata.run_id,
            "round": server_round,
            "round-from": source,
            "node": node,
            "partition": context.node_config.get("partition-id"),
            "node-config": dict(context.node_config),
            "observer": "client-mod",
            "run_config": dict(context.run_config),
        }
        size = add_direction(stem, "received", msg, **head)
        size += add_direction(stem, "sent", reply, **head)
        log(20, "fedvit capture: round %d node %d (%.2f MB) -> %s", server_round, node, size / 1e6, stem.parent)
    except Exception as err:  # noqa: BLE001 — capture must never break the client
        log(30, "fedvit capture: not recorded (%s: %s)", type(err).__name__, err)
    return reply


class CapturingStrategy(Strategy):
    """Wraps any Message-API strategy (as Flower's DP wrappers do) and records, for the honest-but-curious
    server, what each sampled node was sent and what it answered: ``<out>/run-<id>/captures/server/...`` in
    the layout above. Every call is delegated unchanged."""

    def __init__(self, strategy: Strategy, out_dir: str | Path, run_config: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.strategy = strategy
        self.root = Path(out_dir).expanduser().resolve()
        self.run_config = dict(run_config or {})
        self._sent: list[tuple[Message, Path, dict[str, Any]]] = []  # instructions awaiting their replies
        self.errors = 0

    def __repr__(self) -> str:
        return f"CapturingStrategy({self.strategy!r}, out_dir={str(self.root)!r})"

    def summary(self) -> None:
        log(20, "\t├── Capture: every train/evaluate exchange -> %s", self.root)
        self.strategy.summary()

    def _stem(self, server_round: int, msg: Message) -> Path:
        node, run_id = msg.metadata.dst_node_id, msg.metadata.run_id
        stem = capture_stem(self.root, run_id, server_round, node, msg.metadata.message_type)
        return stem.parent.parent / "server" / stem.parent.name / stem.name

    def _record_sent(self, server_round: int, messages: Iterable[Message]) -> list[Message]:
        messages = list(messages)
        for msg in messages:
            head = {
                "run-id": msg.metadata.run_id,
                "round": server_round,
                "round-from": "server-round",
                "node": msg.metadata.dst_node_id,
                "observer": "server",
                "run_config": self.run_config,
            }
            stem = self._stem(server_round, msg)
            self._guarded(add_direction, stem, "received", msg, **head)
            self._sent.append((msg, stem, head))
        return messages

    def _record_replies(self, replies: Iterable[Message]) -> list[Message]:
        """Each reply beside the instruction it answers (message ids are set once the grid has pushed them)."""
        replies = list(replies)
        waiting = {msg.metadata.message_id: (stem, head) for msg, stem, head in self._sent}
        self._sent = []
        for reply in replies:
            if reply.metadata.reply_to_message_id in waiting:
                stem, head = waiting[reply.metadata.reply_to_message_id]
                self._guarded(add_direction, stem, "sent", reply, **head)
        return replies

    def _guarded(self, write: Callable, *args: Any, **kwargs: Any) -> None:
        try:
            write(*args, **kwargs)
        except Exception as err:  # noqa: BLE001 — capture must never stop the run
            self.errors += 1
            log(30, "fedvit capture: not recorded (%s: %s)", type(err).__name__, err)

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        return self._record_sent(server_round, self.strategy.configure_train(server_round, arrays, config, grid))

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        return self.strategy.aggregate_train(server_round, self._record_replies(replies))

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        return self._record_sent(server_round, self.strategy.configure_evaluate(server_round, arrays, config, grid))

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        return self.strategy.aggregate_evaluate(server_round, self._record_replies(replies))
