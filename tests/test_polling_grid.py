"""fedvit's PollingGrid: a pull that outlasts the round's deadline does not cost the replies that arrived meanwhile
(a SuperNode killed while uploading its reply makes Flower's pull of that reply wait for the SuperLink's
object-push session to expire; a SecAgg+ round then lost every other reply and failed, seen in CI)."""

from __future__ import annotations

import time

from flwr.app import Error, Message, MessageType, RecordDict
from flwr.app.message import make_message

from fedvit.app.polling_grid import PollingGrid
from tests.helpers import reply_metadata

STUCK = 4  # the node whose reply's objects never arrive


class SlowPullGrid:
    """Nodes 1-4 answer at once, but pulling node 4's reply (it is listed first) blocks for ``block_s`` and then
    yields an error reply, as Flower's HttpGrid does when a reply's objects never arrive. A pull returns the
    replies that had arrived when it started."""

    def __init__(self, block_s: float) -> None:
        self.block_s, self.pulls, self._arrived = block_s, 0, set()

    def push_messages(self, messages):
        ids = []
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = f"to-{msg.metadata.dst_node_id}"
            ids.append(msg.metadata.message_id)
        return ids

    def pull_messages(self, message_ids):
        self.pulls += 1
        ready, self._arrived = set(self._arrived), {f"to-{n}" for n in (1, 2, 3)}  # the others arrive meanwhile
        out = []
        if f"to-{STUCK}" in message_ids:
            time.sleep(self.block_s)
            out.append(self._reply(STUCK, error=Error(code=3, reason="Reply message objects are unavailable.")))
        out += [self._reply(int(i.removeprefix("to-"))) for i in sorted(ready & set(message_ids))]
        return out

    @staticmethod
    def _reply(node: int, error: Error | None = None) -> Message:
        meta = reply_metadata(node, MessageType.TRAIN)
        meta.__dict__["_reply_to_message_id"] = f"to-{node}"
        return make_message(meta, error=error) if error else make_message(meta, content=RecordDict())


def test_replies_that_arrived_while_a_pull_outlasted_the_deadline_are_returned():
    grid = SlowPullGrid(block_s=0.3)
    messages = [Message(RecordDict(), dst_node_id=n, message_type=MessageType.TRAIN) for n in (STUCK, 1, 2, 3)]
    replies = PollingGrid(grid, interval=0.01).send_and_receive(messages, timeout=0.1)
    assert sorted(r.metadata.src_node_id for r in replies) == [1, 2, 3, STUCK]
    assert [r.metadata.src_node_id for r in replies if r.has_error()] == [STUCK]
    assert grid.pulls == 2  # one pull after the deadline, no more


def test_the_deadline_still_ends_the_wait_for_replies_that_never_come():
    grid = SlowPullGrid(block_s=0.0)
    grid.pull_messages = lambda ids: []  # nobody answers
    messages = [Message(RecordDict(), dst_node_id=n, message_type=MessageType.TRAIN) for n in (1, 2)]
    started = time.monotonic()
    assert PollingGrid(grid, interval=0.01).send_and_receive(messages, timeout=0.2) == []
    assert 0.2 <= time.monotonic() - started < 2.0
