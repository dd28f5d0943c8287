"""The run's Grid with a shorter reply poll: Flower 1.41's deployment ``HttpGrid.send_and_receive`` sleeps a fixed
3 s between pulls; this wrapper does the same push-then-pull through the Grid's public ``push_messages`` /
``pull_messages`` every ``FEDVIT_GRID_POLL_INTERVAL`` seconds (default 0.2). Everything else is the Grid's own."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable

from flwr.app import Message
from flwr.serverapp import Grid

from core.config import ConfigError

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
    """Wraps a Grid; only ``send_and_receive`` is re-implemented (same semantics, another poll interval)."""

    def __init__(self, grid: Grid, interval: float) -> None:
        self._grid = grid
        self.interval = interval

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> list[Message]:
        """Push ``messages``, then pull until every reply arrived or ``timeout`` s passed (None: no limit)."""
        pending = set(self._grid.push_messages(messages))
        deadline = None if timeout is None else time.monotonic() + timeout
        replies: list[Message] = []
        while pending:
            got = list(self._grid.pull_messages(pending))
            replies.extend(got)
            pending.difference_update(m.metadata.reply_to_message_id for m in got)
            if not pending or (deadline is not None and time.monotonic() >= deadline):
                break
            time.sleep(self.interval)
        return replies

    def __getattr__(self, name: str):
        return getattr(self._grid, name)
