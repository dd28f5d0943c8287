"""The run's Grid with a shorter reply poll: Flower 1.41's deployment ``HttpGrid.send_and_receive`` sleeps a fixed
3 s between pulls; this wrapper does the same push-then-pull through the Grid's public ``push_messages`` /
``pull_messages`` every ``FEDVIT_GRID_POLL_INTERVAL`` seconds (default 0.2), and packs each message's ArrayRecords
into one object each on the way out and unpacks replies on the way in (``fedvit.core.wire``: fewer transfers, the
same bytes). Everything else is the Grid's own."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable

from flwr.app import Message, RecordDict
from flwr.serverapp import Grid

from fedvit.core.config import ConfigError
from fedvit.core.wire import is_packed, pack, unpack

POLL_ENV = "FEDVIT_GRID_POLL_INTERVAL"
DEFAULT_POLL_S = 0.2


def poll_interval() -> float:
    """``$FEDVIT_GRID_POLL_INTERVAL`` in seconds (0.01 to 60), else the default; a bad value is a ConfigError."""
    raw = os.environ.get(POLL_ENV)
    if raw is None:
        return DEFAULT_POLL_S
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not 0.01 <= value <= 60.0:
        raise ConfigError(POLL_ENV, raw, "a number of seconds between 0.01 and 60 (environment variable)")
    return value


class PollingGrid:
    """Wraps a Grid; only ``send_and_receive`` is re-implemented (Flower's semantics, another poll interval, packed
    ArrayRecords on the wire, and one pull that starts after the deadline)."""

    def __init__(self, grid: Grid, interval: float, packed: bool = True) -> None:
        self._grid = grid
        self.interval = interval
        self.packed = packed  # False: Flower's own message layout (e.g. for a stock ClientApp)

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> list[Message]:
        """Push ``messages``, then pull until every reply arrived or ``timeout`` s passed (None: no limit); the
        last pull starts after the deadline, so every reply that arrived in time is returned."""
        messages = list(messages)
        packed: dict[int, RecordDict] = {}  # one packing per content: messages that share content keep sharing it
        for msg in messages:
            if self.packed and msg.has_content():
                if id(msg.content) not in packed:
                    packed[id(msg.content)] = pack(msg.content)
                msg.content = packed[id(msg.content)]
        pending = set(self._grid.push_messages(messages))
        deadline = None if timeout is None else time.monotonic() + timeout
        replies: list[Message] = []
        while pending:
            # Read the clock before pulling, not after: one pull can outlast the deadline (Flower retries a reply
            # whose sender died mid-upload until the SuperLink's object-push session expires, 180 s in Flower
            # 1.41), and the replies that reached the SuperLink meanwhile must still be pulled, not dropped.
            late = deadline is not None and time.monotonic() >= deadline
            got = list(self._grid.pull_messages(pending))
            for reply in got:
                if reply.has_content() and is_packed(reply.content):
                    reply.content = unpack(reply.content)
            replies.extend(got)
            pending.difference_update(m.metadata.reply_to_message_id for m in got)
            if late:
                break
            if pending:
                time.sleep(self.interval)
        return replies

    def __getattr__(self, name: str):
        return getattr(self._grid, name)
