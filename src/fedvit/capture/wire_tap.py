"""What a network eavesdropper on the Fleet API records: Flower messages rebuilt from the HTTP bodies it relays.

The proxy (``fedvit tap``, :mod:`fedvit.app.tap`) hands every request/response pair to a :class:`WireRecorder`
and returns at once; a worker thread parses the bodies with Flower's generated protobuf classes, keeps each
object of a message's object tree on disk as it completes (a content-addressed spool, bounded in size), and,
once a tree is whole, rebuilds the Message with Flower's own serde (``inflate_object_from_contents``) and writes
it in the capture layout of :mod:`fedvit.capture.writer`: what the node pulled is ``received``, what it pushed in
reply is ``sent``. ``get-run`` and ``get-fab`` responses give each run's config (the FAB's defaults fused with the
run's overrides, by Flower's own function), written to ``run-<id>/run.json`` and into the manifests (a node
fetches the FAB after its first message of a run, so run.json is the complete record); the bundle itself is kept
once under ``fabs/<sha256>.fab``: the app's code, which the audit reads the client's recipe from. A body that does not
parse, an object that does not inflate, a full disk: each is logged and counted, and relaying goes on (the
recorder never raises into the proxy, never blocks it: a full queue drops records).
"""

from __future__ import annotations

import hashlib
import json
import logging
import queue
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flwr.app import Message
from flwr.common.config import get_fused_config_from_fab
from flwr.common.serde import message_from_proto, run_from_proto
from flwr.proto.fab_pb2 import GetFabRequest, GetFabResponse  # pylint: disable=E0611
from flwr.proto.fleet_pb2 import (  # pylint: disable=E0611
    PullMessagesRequest,
    PullMessagesResponse,
    PushMessagesRequest,
)
from flwr.proto.message_pb2 import (  # pylint: disable=E0611
    ObjectTree,
    PullObjectRequest,
    PullObjectResponse,
    PushObjectRequest,
)
from flwr.proto.run_pb2 import GetRunRequest, GetRunResponse  # pylint: disable=E0611
from flwr.supercore.inflatable.inflatable_object import get_object_id, iterate_object_tree
from flwr.supercore.inflatable.inflatable_utils import inflate_object_from_contents, validate_object_content

from fedvit.capture.writer import RoundCounter, add_direction, capture_stem, new_exchange
from fedvit.core.results import atomic_write

LOG = logging.getLogger("fedvit.tap")
FLEET = "/v1/fleet/"
DEFAULT_SPOOL_BYTES = 2 << 30
FABS = "fabs"  # the app bundles the nodes fetched, by content hash (the tap's folder)


@dataclass
class PendingMessage:
    """A message whose object tree was announced (pull-messages / push-messages) and is being collected."""

    direction: str  # "received" (the node pulled it) or "sent" (the node pushed it)
    node: int
    metadata: Any  # the announced Message proto (metadata; content travels as objects)
    object_ids: set[str]
    announced: float = field(default_factory=time.monotonic)


class ObjectSpool:
    """Object contents on disk by object id, oldest evicted beyond ``limit`` bytes (memory holds ids only)."""

    def __init__(self, root: Path, limit: int) -> None:
        self.root, self.limit, self.total = root, limit, 0
        self.sizes: OrderedDict[str, int] = OrderedDict()
        root.mkdir(parents=True, exist_ok=True)

    def put(self, object_id: str, content: bytes) -> None:
        if object_id in self.sizes:
            return
        (self.root / object_id).write_bytes(content)
        self.sizes[object_id] = len(content)
        self.total += len(content)
        while self.total > self.limit and len(self.sizes) > 1:
            old, size = self.sizes.popitem(last=False)
            (self.root / old).unlink(missing_ok=True)
            self.total -= size

    def __contains__(self, object_id: str) -> bool:
        return object_id in self.sizes

    def read(self, object_ids: set[str]) -> dict[str, bytes]:
        return {i: (self.root / i).read_bytes() for i in object_ids}


class WireRecorder:
    """Rebuilds and records the Messages crossing a Fleet API link (see the module docstring)."""

    def __init__(self, out: Path, spool_bytes: int = DEFAULT_SPOOL_BYTES, queue_size: int = 1024) -> None:
        self.out = Path(out).resolve()
        self.spool = ObjectSpool(self.out / ".spool", spool_bytes)
        self.stats: dict[str, int] = dict.fromkeys(
            ("requests", "objects", "seen-received", "seen-sent", "received", "sent", "fabs", "parse-errors",
             "write-errors", "dropped", "incomplete"), 0,  # fmt: skip
        )
        self._pending: dict[str, PendingMessage] = {}  # root object id -> message being collected
        self._waiting_for: dict[str, set[str]] = {}  # object id -> roots that need it
        self._runs: dict[int, dict[str, Any]] = {}  # run id -> run config and FAB (from get-run)
        self._run_protos: dict[int, Any] = {}  # run id -> flwr Run (get-run)
        self._fab_configs: dict[str, bytes] = {}  # FAB hash -> the bundle (get-fab), for its default config
        self._instructions: OrderedDict[str, tuple[Path, dict[str, Any]]] = OrderedDict()  # message id -> capture
        self._rounds = RoundCounter()
        self._queue: queue.Queue = queue.Queue(maxsize=queue_size)
        self._worker = threading.Thread(target=self._work, name="fedvit-tap-recorder", daemon=True)
        self._worker.start()

    # -- the proxy's side: never blocks, never raises ------------------------------------------------------------
    def observe(self, path: str, request: bytes, response: bytes, status: int) -> None:
        """Queue one relayed exchange for recording (dropped and counted when the recorder is behind)."""
        try:
            self._queue.put_nowait((path, request, response, status))
        except queue.Full:
            self.stats["dropped"] += 1

    def close(self, timeout: float = 30.0) -> None:
        """Record what is queued, then stop the worker."""
        self._queue.put((None, b"", b"", 0))
        self._worker.join(timeout)

    # -- the worker ---------------------------------------------------------------------------------------------
    def _work(self) -> None:
        while True:
            path, request, response, status = self._queue.get()
            if path is None:
                return
            self.stats["requests"] += 1
            try:
                self.handle(path, request, response, status)
            except OSError as err:
                self.stats["write-errors"] += 1
                LOG.warning("tap: could not write a record (%s); relaying on", err)
            except Exception as err:  # noqa: BLE001 — a record that fails must not stop the recorder
                self.stats["parse-errors"] += 1
                LOG.warning("tap: could not parse %s (%s: %s); relaying on", path, type(err).__name__, err)

    def handle(self, path: str, request: bytes, response: bytes, status: int) -> None:
        """Parse one exchange and record what it completes (synchronous; the worker calls it)."""
        if status != 200 or not path.startswith(FLEET):
            return
        call = path[len(FLEET) :]
        if call == "get-run":
            self._got_run(GetRunRequest.FromString(request), GetRunResponse.FromString(response))
        elif call == "get-fab":
            self._got_fab(GetFabRequest.FromString(request), GetFabResponse.FromString(response))
        elif call == "pull-messages":
            reply = PullMessagesResponse.FromString(response)
            node = PullMessagesRequest.FromString(request).node.node_id
            for proto, tree in zip(reply.messages_list, reply.message_object_trees, strict=True):
                self._announce("received", node, proto, tree)
        elif call == "push-messages":
            pushed = PushMessagesRequest.FromString(request)
            for proto, tree in zip(pushed.messages_list, pushed.message_object_trees, strict=True):
                self._announce("sent", pushed.node.node_id, proto, tree)
        elif call == "pull-object":
            pulled = PullObjectResponse.FromString(response)
            if pulled.object_found and pulled.object_available:
                self._object(PullObjectRequest.FromString(request).object_id, pulled.object_content)
        elif call == "push-object":
            pushed_object = PushObjectRequest.FromString(request)
            self._object(pushed_object.object_id, pushed_object.object_content)

    def _got_run(self, request: GetRunRequest, response: GetRunResponse) -> None:
        run = run_from_proto(response.run)
        self._run_protos[request.run_id] = run
        info = {
            "run-id": run.run_id,
            "fab-id": run.fab_id,
            "fab-version": run.fab_version,
            "fab-hash": run.fab_hash,
            "run_config": dict(run.override_config),
            "run-config-source": "the run's overrides only (the FAB's defaults were not seen on the wire yet)",
        }
        if run.fab_hash in self._fab_configs:
            info |= self._fused(run)
        self._save_run(request.run_id, info)

    def _got_fab(self, request: GetFabRequest, response: GetFabResponse) -> None:
        """The app bundle a node fetched: kept whole (the app's code, which the audit reads its recipe from), once
        per content under ``fabs/<sha256>.fab``; its pyproject's defaults complete the run config (Flower's own
        fuse)."""
        fab_hash = response.fab.hash_str
        if fab_hash not in self._fab_configs:
            digest = hashlib.sha256(response.fab.content).hexdigest()
            if digest != fab_hash:  # Flower names a FAB by its content's SHA-256: anything else was not relayed whole
                LOG.warning("tap: a FAB whose content does not hash to its name %s; not kept", fab_hash[:12])
                return
            path = self.out / FABS / f"{digest}.fab"
            if not path.exists():
                atomic_write(path, response.fab.content)
            self.stats["fabs"] += 1
        self._fab_configs[fab_hash] = response.fab.content
        run = self._run_protos.get(request.run_id)
        if run is not None and run.fab_hash == fab_hash:
            self._save_run(request.run_id, self._runs.get(request.run_id, {}) | self._fused(run))

    def _fused(self, run: Any) -> dict[str, Any]:
        config = get_fused_config_from_fab(self._fab_configs[run.fab_hash], run)
        return {"run_config": dict(config), "run-config-source": "the FAB's defaults with the run's overrides",
                "fab-file": f"{FABS}/{run.fab_hash}.fab"}  # fmt: skip

    def _save_run(self, run_id: int, info: dict[str, Any]) -> None:
        if self._runs.get(run_id) != info:
            self._runs[run_id] = info
            atomic_write(self.out / f"run-{run_id}" / "run.json", json.dumps(info, indent=1).encode())

    def _announce(self, direction: str, node: int, proto: Any, tree: ObjectTree) -> None:
        self.stats[f"seen-{direction}"] += 1  # every message the wire announced; "received"/"sent": those kept
        ids = {t.object_id for t in iterate_object_tree(tree)}
        self._pending[tree.object_id] = PendingMessage(direction, node, proto, ids)
        for object_id in ids:
            self._waiting_for.setdefault(object_id, set()).add(tree.object_id)
        self._expire()
        self._complete(tree.object_id)  # objects the spool already holds (content-addressed: sent before)

    def _object(self, object_id: str, content: bytes) -> None:
        validate_object_content(content)  # malformed or truncated: raises, counted as a parse error
        if get_object_id(content) != object_id:
            raise ValueError(f"object {object_id[:12]}: content does not hash to its id")
        self.stats["objects"] += 1
        self.spool.put(object_id, content)
        for root in list(self._waiting_for.get(object_id, ())):
            self._complete(root)

    def _complete(self, root: str) -> None:
        pending = self._pending.get(root)
        if pending is None or not all(i in self.spool for i in pending.object_ids):
            return
        self._forget(root)
        contents = self.spool.read(pending.object_ids)
        msg = inflate_object_from_contents(root, contents, keep_object_contents=False)
        if not isinstance(msg, Message):
            raise TypeError(f"object tree {root[:12]} holds a {type(msg).__name__}, not a Message")
        announced = message_from_proto(pending.metadata).metadata
        self._record(pending, msg, root, announced)

    def _forget(self, root: str) -> None:
        pending = self._pending.pop(root)
        for object_id in pending.object_ids:
            roots = self._waiting_for.get(object_id, set())
            roots.discard(root)
            if not roots:
                self._waiting_for.pop(object_id, None)

    def _expire(self, max_age: float = 3600.0) -> None:
        """Give up on messages whose objects never all crossed the wire (e.g. the tap started mid-message)."""
        now = time.monotonic()
        for root in [r for r, p in self._pending.items() if now - p.announced > max_age]:
            self._forget(root)
            self.stats["incomplete"] += 1
            LOG.warning("tap: message %s never completed on the wire; not recorded", root[:12])

    def _record(self, pending: PendingMessage, msg: Message, root: str, announced: Any) -> None:
        if pending.direction == "received":
            server_round, source = self._rounds.round_of(msg, pending.node)
            stem = new_exchange(capture_stem(self.out, msg.metadata.run_id, server_round, pending.node,
                                             msg.metadata.message_type))  # fmt: skip
            head = {
                "run-id": msg.metadata.run_id,
                "round": server_round,
                "round-from": source,
                "node": pending.node,
                "partition": None,  # the node's partition is local to it: the wire does not carry it
                "observer": "wire-tap",
                **{k: v for k, v in self._runs.get(msg.metadata.run_id, {}).items() if k != "run-id"},
            }
            self._instructions[root] = (stem, head)  # an instruction's message id is its root object id
            while len(self._instructions) > 10_000:
                self._instructions.popitem(last=False)
        else:
            found = self._instructions.pop(announced.reply_to_message_id, None)
            if found is None:
                self.stats["incomplete"] += 1
                LOG.warning("tap: a reply from node %d answers a message the tap did not see", pending.node)
                return
            stem, head = found
        add_direction(stem, pending.direction, msg, **head)
        self.stats[pending.direction] += 1
        LOG.info("tap: %s %s of node %d, round %s", pending.direction, msg.metadata.message_type, pending.node,
                 head["round"])  # fmt: skip
