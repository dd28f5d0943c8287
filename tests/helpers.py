"""Shared test helpers: Flower reply messages without a running Flower runtime, a fake Grid."""

from __future__ import annotations

import copy
import functools
import time
from types import SimpleNamespace

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Error, Message, Metadata, MetricRecord, RecordDict
from flwr.app.message import make_message


def reply_metadata(src_node_id: int, message_type: str) -> Metadata:
    """Metadata of a reply from ``src_node_id`` to the server."""
    return Metadata(
        run_id=1,
        message_id=f"{message_type}-{src_node_id}",
        src_node_id=src_node_id,
        dst_node_id=0,
        reply_to_message_id="i",
        group_id="1",
        created_at=time.time(),
        ttl=60.0,
        message_type=message_type,
    )


def reply(
    src_node_id: int,
    arrays: dict[str, np.ndarray] | None = None,
    error: str | None = None,
    records: dict[str, dict[str, np.ndarray]] | None = None,
    **metrics,
) -> Message:
    """A train reply from ``src_node_id`` as the strategy would receive it (``records``: more ArrayRecords)."""
    meta = reply_metadata(src_node_id, "train")
    if error is not None:
        return make_message(meta, error=Error(code=2, reason=error))
    content = RecordDict({"metrics": MetricRecord(metrics)})
    if arrays is not None:
        content["arrays"] = ArrayRecord({k: Array(np.asarray(v)) for k, v in arrays.items()})
    for name, record in (records or {}).items():
        content[name] = ArrayRecord({k: Array(np.asarray(v)) for k, v in record.items()})
    return make_message(meta, content=content)


class FakeGrid:
    """Answers the partition query for a fixed node-id -> partition-id map."""

    def __init__(self, partition_of: dict[int, int]) -> None:
        self.partition_of = partition_of
        self.queries = 0

    def get_node_ids(self):
        return list(self.partition_of)

    def send_and_receive(self, messages, *, timeout=None):
        out = []
        for msg in messages:
            self.queries += 1
            node = msg.metadata.dst_node_id
            meta = reply_metadata(node, "query")
            info = {
                "partition-id": self.partition_of[node],
                "num-partitions": len(self.partition_of),
                "num-classes": 10,
            }
            out.append(make_message(meta, content=RecordDict({"config": ConfigRecord(info)})))
        return out


def delivered(msg: Message) -> Message:
    """``msg`` as its node receives it: its own copy of the content (messages that share a RecordDict on the
    server, as the SecAgg+ setup does, arrive as separate copies; mods may change theirs)."""
    out = make_message(copy.deepcopy(msg.metadata), content=copy.deepcopy(msg.content))
    return out


class LocalGrid:
    """A Grid that answers each message by calling the ClientApp's handlers in this process (no Ray).

    ``node_config`` adds client-only settings per partition id (e.g. a key file); every message in
    both directions is kept in ``sent`` / ``received`` so tests can inspect what crossed the wire.
    """

    def __init__(self, run_config: dict, num_nodes: int, node_config: dict[int, dict] | None = None) -> None:
        from flwr.app import Context

        self.contexts = {
            100 + p: Context(
                run_id=1,
                node_id=100 + p,
                node_config={"partition-id": p, "num-partitions": num_nodes, **(node_config or {}).get(p, {})},
                state=RecordDict(),
                run_config=run_config,
            )
            for p in range(num_nodes)
        }
        self.run = SimpleNamespace(run_id=1)  # what Flower's legacy workflow reads of a Grid
        self.sent: list[Message] = []
        self.received: list[Message] = []
        self._inbox: dict[str, Message] = {}  # push/pull: replies by the id of the message they answer

    def get_node_ids(self):
        return list(self.contexts)

    def send_and_receive(self, messages, *, timeout=None):
        import traceback

        from fedvit.app import client_app

        handlers = {"query": client_app.query, "train": client_app.train, "evaluate": client_app.evaluate}
        replies = []
        for msg in messages:
            self.sent.append(msg)
            node = msg.metadata.dst_node_id
            try:
                handler = handlers[msg.metadata.message_type]
                for mod in reversed(client_app.MODS):  # as Flower applies them: the first mod is outermost
                    handler = functools.partial(mod, call_next=handler)
                out = handler(delivered(msg), self.contexts[node])
                out = make_message(reply_metadata(node, msg.metadata.message_type), content=out.content)
            except Exception:  # noqa: BLE001 - Flower turns a handler's exception into an error reply
                error = Error(code=1, reason=traceback.format_exc())
                out = make_message(reply_metadata(node, msg.metadata.message_type), error=error)
            replies.append(out)
        self.received.extend(replies)
        return replies

    def push_messages(self, messages):
        """The Grid calls fedvit's PollingGrid makes: each message is answered at once and its reply kept until
        pulled; returns the ids Flower would give the messages."""
        ids = []
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = f"m{len(self.sent)}"
            (reply,) = self.send_and_receive([msg])
            reply.metadata.__dict__["_reply_to_message_id"] = msg.metadata.message_id
            self._inbox[msg.metadata.message_id] = reply
            ids.append(msg.metadata.message_id)
        return ids

    def pull_messages(self, message_ids):
        return [self._inbox.pop(i) for i in list(message_ids) if i in self._inbox]


def run_in_process(
    run_config: dict, num_nodes: int = 3, node_config: dict[int, dict] | None = None, polling: bool = False
):
    """The whole ServerApp ``run`` against a :class:`LocalGrid` (through fedvit's PollingGrid, as in a Flower run,
    when ``polling``: packed records on the wire); returns (run dir, grid)."""
    from flwr.app import Context

    from fedvit.app.polling_grid import PollingGrid
    from fedvit.app.server_app import run

    grid = LocalGrid(run_config, num_nodes, node_config)
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=run_config)
    return run(PollingGrid(grid, 0.01) if polling else grid, context), grid


def key_needles(key) -> list[bytes]:
    """Byte patterns that would betray an encryption key: E_a rows (float64/float32), E_b's permutation, the seed."""
    rows = [key.e_a[i] for i in (0, 1, key.patch_dim - 1)]
    return (
        [r.tobytes() for r in rows]
        + [r.astype(np.float32).tobytes() for r in rows]
        + [key.perm.tobytes(), key.perm.astype(np.int32).tobytes()]
        + [str(key.init_seed).encode(), repr(float(key.e_a[0, 0])).encode()]
    )


def find_key_material(key, blobs: dict[str, bytes]) -> list[str]:
    """Names of the blobs that contain any of :func:`key_needles`."""
    needles = key_needles(key)
    return [where for where, blob in blobs.items() if any(n in blob for n in needles)]
