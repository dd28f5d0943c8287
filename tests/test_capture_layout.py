"""The capture layout keeps every exchange: several messages to one node in one round (SecAgg+ sends four: setup,
share keys, collect masked vectors, unmask) are recorded side by side, by the tap, ``capture_mod`` and
``CapturingStrategy`` alike, and read back in order."""

from __future__ import annotations

import json

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.app.message import make_message

from fedvit.capture.reader import find_manifests, load_exchanges
from fedvit.capture.wire_tap import WireRecorder
from fedvit.capture.writer import CapturingStrategy, capture_mod, capture_stem, new_exchange
from tests.helpers import reply_metadata
from tests.test_tap import NODE, answer, pull_exchanges, push_exchanges, weights

STAGES = ("setup", "share_keys", "collect_masked_vectors", "unmask")


def staged(stage: str, server_round: int = 3) -> Message:
    """A train instruction of one SecAgg+-like stage: the model and the stage in its ConfigRecords."""
    content = RecordDict({"arrays": ArrayRecord({k: Array(v) for k, v in weights(STAGES.index(stage)).items()}),
                          "config": ConfigRecord({"server-round": server_round}),
                          "secaggplus_configs": ConfigRecord({"stage": stage})})  # fmt: skip
    msg = Message(content, dst_node_id=NODE, message_type="train")
    msg.metadata.__dict__["_message_id"] = msg.object_id
    return msg


def stages_of(root) -> list[str]:
    """The stage of each train exchange under ``root``, in the reader's order."""
    manifests = [json.loads(m.read_text()) for m in find_manifests(root)]
    return [m["received"]["config"]["secaggplus_configs"]["stage"] for m in manifests]


def test_the_writer_never_overwrites_an_exchange(tmp_path):
    stem = capture_stem(tmp_path, 1, 2, NODE, "train")
    assert new_exchange(stem) == stem
    stem.parent.mkdir(parents=True)
    stem.with_name(stem.name + ".json").write_text("{}")
    assert new_exchange(stem).name == f"node-{NODE}~2"
    (stem.parent / f"node-{NODE}~2.json").write_text("{}")
    assert new_exchange(stem).name == f"node-{NODE}~3"


def test_the_tap_keeps_every_stage_of_a_round_and_counts_what_it_saw(tmp_path):
    recorder = WireRecorder(tmp_path)
    for stage in STAGES:
        ins = staged(stage)
        for exchange in pull_exchanges(ins) + push_exchanges(answer(ins, weights(9), examples=4)):
            recorder.handle(*exchange)
    recorder.close()
    assert stages_of(tmp_path) == list(STAGES)
    names = [m.stem for m in find_manifests(tmp_path)]
    assert names == [f"node-{NODE}", f"node-{NODE}~2", f"node-{NODE}~3", f"node-{NODE}~4"]
    stats = recorder.stats
    assert stats["seen-received"] == stats["received"] == 4 and stats["seen-sent"] == stats["sent"] == 4
    exchanges, skipped = load_exchanges(tmp_path)
    assert [e.received_config["stage"] for e in exchanges] == list(STAGES) and skipped == []
    for k, e in enumerate(exchanges):  # each stage's own model, not the last one's
        np.testing.assert_array_equal(e.received["conv.weight"], weights(k)["conv.weight"])


def test_capture_mod_and_the_strategy_keep_every_stage(tmp_path):
    context = Context(run_id=5, node_id=NODE, node_config={"partition-id": 0}, state=RecordDict(),
                      run_config={"fedvit-capture-dir": str(tmp_path / "client")})  # fmt: skip

    def reply_to(msg: Message, _context: Context) -> Message:
        meta = reply_metadata(NODE, "train")
        meta.__dict__.update(_reply_to_message_id=msg.metadata.message_id, _run_id=msg.metadata.run_id)
        return make_message(meta, content=RecordDict({"arrays": msg.content["arrays"],
                                                      "metrics": MetricRecord({"num-examples": 1})}))  # fmt: skip

    for stage in STAGES:
        capture_mod(staged(stage), context, reply_to)
    assert stages_of(tmp_path / "client") == list(STAGES)

    class Stages:  # a strategy whose every configure_train sends the next stage to the one node
        def __init__(self) -> None:
            self.sent = iter(STAGES)

        def summary(self) -> None: ...

        def configure_train(self, server_round, arrays, config, grid):
            return [staged(next(self.sent), server_round)]

        def aggregate_train(self, server_round, replies):
            return None, None

    strategy = CapturingStrategy(Stages(), tmp_path / "server")
    for _ in STAGES:
        (ins,) = strategy.configure_train(3, ArrayRecord(), ConfigRecord(), None)
        strategy.aggregate_train(3, [reply_to(ins, context)])
    assert strategy.errors == 0
    assert stages_of(tmp_path / "server" / "run-1" / "captures" / "server") == list(STAGES)
