"""Capture: one layout and one writer for what crosses the wire, for any Flower app (fedvit's own included).

The wire tap, the ClientApp mod :func:`capture_mod` and the server-side :class:`CapturingStrategy` all write
``<root>/run-<run id>/captures/round-NNNN/node-<node id>[-<type>]``: a ``.json`` manifest (round, node, its
``partition-id`` and node config, the run config; per direction the records and array shapes) and one
``.<direction>.safetensors`` per direction (``received``: what the node got, ``sent``: what it answered;
``<record>/<name>``, fedvit's packed records unpacked). Other messages than train carry their type in the name;
the server's view goes to ``captures/server/``. The round is a ConfigRecord's ``server-round``, else a numeric
``group_id``, else the node's count of messages of that type.

fedvit's app steers the same writer with ``capture.*`` (root: ``<out-dir>/<run-name>``); with
``capture.ground-truth`` its clients write their true batch to ``run-<id>/ground-truth/``, for the scoring only.
Nothing here changes a message; a failure to write is logged, never raised.
"""

from __future__ import annotations

import functools
import json
import os
import re
import sys
import tomllib
from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.common.config import flatten_dict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from fedvit.core.config import Config, ConfigError, parse_config_cached, parse_selection
from fedvit.core.results import atomic_save_safetensors, atomic_write
from fedvit.core.wire import LAYOUT_RECORD, is_packed, unpack

SECAGG_RECORD = "secaggplus_configs"  # Flower's SecAgg+ ConfigRecord (flwr.common.secure_aggregation)

CAPTURES = "captures"
GROUND_TRUTH = "ground-truth"
SERVER_VIEW = "server"
CAPTURE_DIR_KEY = "fedvit-capture-dir"  # run-config key an app may set for capture_mod
CAPTURE_DIR_ENV = "FEDVIT_CAPTURE_DIR"
DEFAULT_CAPTURE_DIR = "fedvit-captures"
FEDVIT_SWITCH = "capture.enabled"  # a run config with this key is fedvit's own app's


# ---------------------------------------------------------------------------- records


def plain_content(msg: Message) -> RecordDict:
    """A message's records, with fedvit's packed ArrayRecords (:mod:`fedvit.core.wire`) unpacked."""
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
    """Inverse of :func:`flatten`: record name → {array name → array} (ConfigRecords' bytes left out)."""
    out: dict[str, dict[str, np.ndarray]] = {}
    for key, value in arrays.items():
        if key.startswith(BYTES):
            continue
        record, _, name = key.partition("/")
        out.setdefault(record, {})[name] = value
    return out


BYTES = "bytes:"  # safetensors key prefix of a ConfigRecord's bytes values (SecAgg+'s keys, shares, masked vectors)


def config_bytes(msg: Message) -> dict[str, np.ndarray]:
    """Every bytes value of the message's ConfigRecords as a uint8 array, keyed ``bytes:<record>/<key>`` (a list
    of bytes: ``.../<key>/<i>``), saved beside the arrays so that nothing is lost (JSON holds no bytes)."""
    if not msg.has_content():
        return {}
    out = {}
    for name, record in plain_content(msg).config_records.items():
        for key, value in record.items():
            if isinstance(value, bytes):
                out[f"{BYTES}{name}/{key}"] = np.frombuffer(value, np.uint8)
            elif isinstance(value, list) and value and all(isinstance(v, bytes) for v in value):
                out |= {f"{BYTES}{name}/{key}/{i}": np.frombuffer(v, np.uint8) for i, v in enumerate(value)}
    return out


def restore_bytes(configs: dict[str, dict[str, Any]], saved: dict[str, np.ndarray]) -> dict[str, dict[str, Any]]:
    """A manifest direction's ConfigRecords with their bytes values back from the saved arrays
    (:func:`config_bytes`)."""
    out = {name: dict(values) for name, values in configs.items()}
    for key, value in saved.items():
        if not key.startswith(BYTES):
            continue
        record, _, rest = key.removeprefix(BYTES).partition("/")
        field, _, index = rest.partition("/")
        if index:
            items = out.setdefault(record, {}).get(field)
            items = items if isinstance(items, list) else []
            items += [b""] * (int(index) + 1 - len(items))
            items[int(index)] = value.tobytes()
            out[record][field] = items
        else:
            out.setdefault(record, {})[field] = value.tobytes()
    return out


def _json_value(value: Any) -> Any:
    """A record value as the manifest holds it: bytes named by their size (their content is in the safetensors)."""
    if isinstance(value, bytes):
        return f"<{len(value)} bytes>"
    if isinstance(value, list) and value and all(isinstance(v, bytes) for v in value):
        return [f"<{len(v)} bytes>" for v in value]
    return value


def _records(msg: Message, kind: str) -> dict[str, Any]:
    if not msg.has_content():
        return {"error": msg.error.reason if msg.has_error() else "no content"}
    records = getattr(plain_content(msg), kind)
    return {name: {k: _json_value(v) for k, v in rec.items()} for name, rec in records.items()
            if name != LAYOUT_RECORD}  # fmt: skip


def describe(msg: Message, arrays: dict[str, np.ndarray]) -> dict[str, Any]:
    """One direction of a capture manifest: message type, array shapes, ConfigRecords, MetricRecords, error."""
    arrays = {k: v for k, v in arrays.items() if not k.startswith(BYTES)}
    entry = direction_entry(msg.metadata.message_type, arrays, _records(msg, "config_records"),
                            _records(msg, "metric_records"))  # fmt: skip
    if msg.has_error():
        entry["error"] = f"{msg.error.code}: {msg.error.reason}"
    return entry


def direction_entry(message_type: str, arrays: dict[str, np.ndarray], configs: dict, metrics: dict) -> dict[str, Any]:
    """A direction's manifest entry from its message type, flattened arrays and records (name → values)."""
    return {
        "message-type": message_type,
        "arrays": {k: list(v.shape) for k, v in arrays.items()},
        "config": configs,
        "metrics": metrics,
    }


# ---------------------------------------------------------------------------- the layout


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


EXCHANGE_SEP = "~"  # node-<id>~<k>: the k-th exchange (k ≥ 2) of one node, type and round (e.g. SecAgg+'s stages)


def new_exchange(stem: Path) -> Path:
    """The stem of a new exchange at ``stem``'s node, type and round: ``stem`` itself while nothing is recorded
    there, else ``<stem>~2``, ``<stem>~3``, ... (the first free one): a second message of a round (SecAgg+ sends
    four) never overwrites the first. A node's exchanges are recorded one after the other."""
    found, k = stem, 1
    while found.with_name(f"{found.name}.json").exists():
        k += 1
        found = stem.with_name(f"{stem.name}{EXCHANGE_SEP}{k}")
    return found


def exchange_number(stem: Path) -> int:
    """1 for ``node-<id>``, k for ``node-<id>~k``."""
    _, sep, k = stem.name.partition(EXCHANGE_SEP)
    return int(k) if sep and k.isdigit() else 1


def ground_truth_path(root: Path, run_id: int, server_round: int, node: int) -> Path:
    """Where a client's true batch of one round goes: beside ``captures/``, under ``ground-truth/``."""
    return Path(root) / f"run-{run_id}" / GROUND_TRUTH / f"round-{server_round:04d}" / f"node-{node}.safetensors"


def add_direction(stem: Path, direction: str, msg: Message, **head: Any) -> int:
    """Write one direction of a capture (``<stem>.<direction>.safetensors``: the arrays and the ConfigRecords'
    bytes) and merge it into ``<stem>.json`` (created with ``head`` when new); returns the bytes saved."""
    arrays = snapshot(msg)
    return write_direction(stem, direction, arrays, describe(msg, arrays), **head)


def snapshot(msg: Message) -> dict[str, np.ndarray]:
    """What a capture saves of a message's payload: its arrays (:func:`flatten`) and its ConfigRecords' bytes."""
    return flatten(msg) | config_bytes(msg)


def write_direction(stem: Path, direction: str, arrays: dict[str, np.ndarray], entry: dict[str, Any], **head) -> int:
    """:func:`add_direction` for records that are not a Flower Message (fedvit's own benchmark writes its client
    updates this way): ``arrays`` flattened as ``<record>/<name>``, ``entry`` the manifest's direction entry."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    manifest_path = stem.with_name(f"{stem.name}.json")
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    for key, value in head.items():
        manifest.setdefault(key, value)
    path = stem.with_name(f"{stem.name}.{direction}.safetensors")
    atomic_save_safetensors(path, arrays)
    manifest[direction] = entry
    atomic_write(manifest_path, json.dumps(manifest, indent=1, default=str).encode())
    return os.path.getsize(path)


# ---------------------------------------------------------------------------- fedvit's own app


def run_dir(config: Config) -> Path:
    """``<out-dir>/<run-name>`` as both sides compute it (capture requires a run name): fedvit's capture root."""
    return (Path(config.out_dir).expanduser() / config.run_name).resolve()


def selected(config: Config, server_round: int, partition_id: int) -> bool:
    """Whether this (round, partition) is captured; round 0 is the setup (the key handshake)."""
    rounds, partitions = parse_selection(config.capture.rounds), parse_selection(config.capture.partitions)
    in_round = rounds is None or server_round in rounds or server_round == 0
    return config.capture.enabled and in_round and (partitions is None or partition_id in partitions)


def fedvit_config(run_config: dict[str, Any]) -> Config | None:
    """fedvit's parsed run config when the run is fedvit's own app (its config has ``capture.enabled``), else None;
    a fedvit config that does not parse is also None (its handler has reported the error)."""
    if FEDVIT_SWITCH not in run_config:
        return None
    try:
        return parse_config_cached(run_config)  # once per process, not per message
    except ConfigError:
        return None


def write_ground_truth(root: Path, run_id: int, server_round: int, node: int, images: np.ndarray, labels: np.ndarray):
    """The client's true batch (``capture.ground-truth``), kept apart from the captures."""
    path = ground_truth_path(root, run_id, server_round, node)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_save_safetensors(path, {"images": images.astype(np.float32), "labels": labels.astype(np.int64)})


def ground_truth_hook(
    config: Config, server_round: int, partition: int, run_id: int, node: int
) -> Callable[[np.ndarray, np.ndarray], None] | None:
    """fedvit's client ``on_batch`` hook that writes its true batch, or None when this round is not recorded."""
    if not (config.capture.ground_truth and selected(config, server_round, partition)):
        return None
    return functools.partial(write_ground_truth, run_dir(config), run_id, server_round, node)


# ---------------------------------------------------------------------------- the observers


def _has_arrays(msg: Message) -> bool:
    """Whether a message carries arrays (packed or not), without copying them."""
    return msg.has_content() and bool(msg.content.array_records)


def capture_dir(context: Context) -> Path:
    """Where :func:`capture_mod` writes for an app that is not fedvit's: the run config's
    ``fedvit-capture-dir``, else $FEDVIT_CAPTURE_DIR, else ``./fedvit-captures`` (absolute, so every ClientApp
    process of a host writes to one place)."""
    chosen = context.run_config.get(CAPTURE_DIR_KEY) or os.environ.get(CAPTURE_DIR_ENV) or DEFAULT_CAPTURE_DIR
    return Path(str(chosen)).expanduser().resolve()


def app_folder(run_config: Iterable[str]) -> str | None:
    """The folder of the Flower app this process runs (its code, which the audit reads the recipe from): the first
    ``sys.path`` entry whose ``pyproject.toml`` declares ``[tool.flwr.app.components]`` of which a module is loaded
    in this process from that folder (Flower puts the app's folder, or its installed FAB's, on the path before it
    loads the app), and whose ``[tool.flwr.app.config]`` keys are those of ``run_config`` (Flower's fused run config
    has exactly the app's keys: a process that loaded another app's modules too, or a ClientApp built outside any
    app, does not name the wrong folder; an empty one is not compared: Flower's ``run_simulation`` without a FAB, or
    a CapturingStrategy given none, carries no config); None where none is. Looked up per call: a process may run
    several apps."""
    keys = set(run_config) or None
    for entry in sys.path:
        folder = Path(entry or ".").resolve()
        try:
            project = tomllib.loads((folder / "pyproject.toml").read_text())
        except (OSError, tomllib.TOMLDecodeError):
            continue
        app = project.get("tool", {}).get("flwr", {}).get("app", {})
        try:
            declared = set(flatten_dict(app.get("config", {})))
        except ValueError:  # a value Flower would refuse too: not this run's app
            continue
        if keys is not None and declared != keys:
            continue
        for reference in app.get("components", {}).values():
            module = sys.modules.get(str(reference).partition(":")[0])
            path = getattr(module, "__file__", None)
            if path and Path(path).resolve().is_relative_to(folder):
                return str(folder)
    return None


_client_rounds = RoundCounter()  # per process: a deployment's per-message ClientApp processes need server-round


def _client_stem(msg: Message, context: Context) -> tuple[Path, int, str] | None:
    """Where this exchange goes (stem, round, how the round was read), or None when it is not captured: for
    fedvit's app only train and query exchanges, in the selected rounds and partitions (and, checked on the
    reply, only those that carry arrays)."""
    node, message_type = context.node_id, msg.metadata.message_type
    if FEDVIT_SWITCH in context.run_config:
        config = fedvit_config(context.run_config)
        if config is None or not config.capture.enabled or message_type not in ("train", "query"):
            return None
        server_round = message_round(msg) if message_type == "train" else None
        server_round = server_round or 0  # the setup (the key handshake) is round 0
        partition = int(context.node_config.get("partition-id", -1))
        if not selected(config, server_round, partition):
            return None
        return capture_stem(run_dir(config), msg.metadata.run_id, server_round, node, message_type), server_round, ""
    server_round, source = _client_rounds.round_of(msg, node)
    stem = capture_stem(capture_dir(context), msg.metadata.run_id, server_round, node, message_type)
    return stem, server_round, source


def capture_mod(msg: Message, context: Context, call_next: Callable[[Message, Context], Message]) -> Message:
    """ClientApp mod for any app (``ClientApp(mods=[capture_mod])``): passes the message on unchanged, then
    records it as it arrived (before any inner mod changes it: secaggplus_mod takes its stage out) and the exact
    reply (train, evaluate and query messages; fedvit's app: as its ``capture.*`` keys say). Errors in writing
    are logged, never raised: the client's work is not disturbed."""
    try:
        where = _client_stem(msg, context)
        arrays = snapshot(msg) if where is not None else {}
        received = (arrays, describe(msg, arrays)) if where is not None else None
    except Exception as err:  # noqa: BLE001 — capture must never break the client
        log(30, "fedvit capture: not recorded (%s: %s)", type(err).__name__, err)
        where = None
    if where is None:
        return call_next(msg, context)
    try:
        reply = call_next(msg, context)
    except Exception as err:  # the client failed (Flower answers with an error): the instruction is still kept
        failed = {"message-type": msg.metadata.message_type, "error": f"raised {type(err).__name__}: {err}"}
        _record_client(msg, context, where, received, ({}, failed))
        raise
    _record_client(msg, context, where, received, reply)
    return reply


def captured(client_app: Any) -> Any:
    """``client_app`` with :func:`capture_mod` outermost, as ``ClientApp(mods=[capture_mod])`` would have it, built
    without editing the app (``fedvit audit-app``'s staged copy): every message, of any type and of the legacy
    ``client_fn`` API too, goes through the mod and then the app's own ``__call__`` (its lifespan and mods)."""
    from flwr.clientapp import ClientApp

    class CapturedClientApp(ClientApp):
        def __call__(self, message: Message, context: Context) -> Message:
            return capture_mod(message, context, client_app)

    return CapturedClientApp()


def _record_client(msg: Message, context: Context, where: tuple[Path, int, str], received: tuple, reply: Any) -> None:
    """Write one exchange :func:`capture_mod` saw: ``received`` as it arrived, ``reply`` the reply Message or, for a
    client that raised, (no arrays, the error's manifest entry). Logs instead of raising."""
    try:
        stem, server_round, source = where
        replied = isinstance(reply, Message)
        secagg = msg.has_content() and SECAGG_RECORD in msg.content.config_records
        if FEDVIT_SWITCH in context.run_config and not (secagg or _has_arrays(msg) or (replied and _has_arrays(reply))):
            return  # fedvit's app: only exchanges that carry arrays, and every SecAgg+ stage
        head = {
            "run-id": msg.metadata.run_id,
            "round": server_round,
            "round-from": source or "server-round",
            "node": context.node_id,
            "partition": context.node_config.get("partition-id"),
            "node-config": dict(context.node_config),
            "observer": "client-mod",
            "run_config": dict(context.run_config),
            "app-dir": app_folder(context.run_config),
        }
        stem = new_exchange(stem)
        size = write_direction(stem, "received", *received, **head)
        size += add_direction(stem, "sent", reply, **head) if replied else write_direction(stem, "sent", *reply, **head)
        log(20, "fedvit capture: round %d node %d (%.2f MB) -> %s", server_round, context.node_id, size / 1e6,
            stem.parent)  # fmt: skip
    except Exception as err:  # noqa: BLE001 — capture must never break the client
        log(30, "fedvit capture: not recorded (%s: %s)", type(err).__name__, err)


class CapturingStrategy(Strategy):
    """Wraps any Message-API strategy (as Flower's DP wrappers do) and records, for the honest-but-curious
    server, what each sampled node was sent and what it answered: ``<out>/run-<id>/captures/server/...`` in
    the layout above. Every call is delegated unchanged. ``select(round, node)`` (optional) picks which
    exchanges are recorded."""

    def __init__(
        self,
        strategy: Strategy,
        out_dir: str | Path,
        run_config: dict[str, Any] | None = None,
        select: Callable[[int, int], bool] | None = None,
    ) -> None:
        super().__init__()
        self.strategy = strategy
        self.root = Path(out_dir).expanduser().resolve()
        self.run_config = dict(run_config or {})
        self.select = select
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
        return stem.parent.parent / SERVER_VIEW / stem.parent.name / stem.name

    def _record_sent(self, server_round: int, messages: Iterable[Message]) -> list[Message]:
        messages = list(messages)
        for msg in messages:
            rnd = message_round(msg) or server_round  # a resumed fedvit run names its own round
            node = msg.metadata.dst_node_id
            if self.select is not None and not self.select(rnd, node):
                continue
            head = {
                "run-id": msg.metadata.run_id,
                "round": rnd,
                "round-from": "server-round",
                "node": node,
                "observer": "server",
                "run_config": self.run_config,
                "app-dir": app_folder(self.run_config),
            }
            stem = new_exchange(self._stem(rnd, msg))
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
