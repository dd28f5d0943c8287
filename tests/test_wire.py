"""Packed ArrayRecords on the wire (fedvit.core.wire): lossless, fewer
objects, and a run computes the same through it."""

from __future__ import annotations

import json

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MessageType, MetricRecord, RecordDict
from flwr.supercore.inflatable.inflatable_object import get_object_tree
from flwr.supercore.inflatable.inflatable_utils import iterate_object_tree
from safetensors.numpy import load_file

from fedvit.core.wire import LAYOUT_RECORD, is_packed, pack, unpack, wire_mod
from tests.helpers import run_in_process


def content() -> RecordDict:
    rng = np.random.default_rng(0)
    arrays = {f"w{i}": rng.normal(size=(i + 1, 3)).astype(np.float32) for i in range(12)}
    arrays["scalar"] = np.array(2.5, np.float64)
    masks = {"m": rng.random((4, 5)) < 0.5, "bits": np.packbits(rng.random(13) < 0.5)}
    return RecordDict(
        {
            "arrays": ArrayRecord({k: Array(v) for k, v in arrays.items()}),
            "config": ConfigRecord({"server-round": 3, "lr": 0.1}),
            "masks": ArrayRecord({k: Array(v) for k, v in masks.items()}),
            "metrics": MetricRecord({"num-examples": 8}),
        }
    )


def objects(c: RecordDict) -> int:
    msg = Message(c, dst_node_id=1, message_type=MessageType.TRAIN)
    return len({t.object_id for t in iterate_object_tree(get_object_tree(msg))})


def test_packing_is_lossless_and_sends_fewer_objects():
    plain = content()
    packed = pack(plain)
    assert is_packed(packed) and not is_packed(plain)
    assert [len(r) for r in packed.array_records.values()] == [1, 1]  # one Array per ArrayRecord
    back = unpack(packed)
    assert list(back.keys()) == list(plain.keys())
    for name, record in plain.array_records.items():
        assert list(back[name].keys()) == list(record.keys())
        for key, array in record.items():
            got = back[name][key]
            assert (got.dtype, got.shape, got.stype, got.data) == (array.dtype, array.shape, array.stype, array.data)
            np.testing.assert_array_equal(got.numpy(), array.numpy())
    assert dict(back["config"]) == dict(plain["config"]) and dict(back["metrics"]) == dict(plain["metrics"])
    assert objects(packed) < objects(plain) / 3  # 15 Arrays (each with its chunk) become 2


def test_a_damaged_layout_is_an_error_not_wrong_arrays():
    packed = pack(content())
    layout = json.loads(str(packed[LAYOUT_RECORD]["arrays"]))
    layout[0][4] -= 4  # four bytes fewer for the first array: every later array would shift
    packed[LAYOUT_RECORD]["arrays"] = json.dumps(layout)
    with pytest.raises(ValueError, match="'arrays'.*bytes"):
        unpack(packed)


def test_the_client_mod_unpacks_what_the_server_packed_and_packs_its_reply():
    seen = {}

    def handler(msg: Message, _context: Context) -> Message:
        seen["content"] = msg.content
        return Message(RecordDict({"arrays": msg.content["arrays"], "metrics": MetricRecord({"n": 1})}), reply_to=msg)

    context = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})
    msg = Message(pack(content()), dst_node_id=1, message_type=MessageType.TRAIN)
    reply = wire_mod(msg, context, handler)
    assert not is_packed(seen["content"]) and list(seen["content"]["arrays"].keys())[0] == "w0"
    assert is_packed(reply.content) and unpack(reply.content)["arrays"]["w3"].data == content()["arrays"]["w3"].data
    plain = Message(content(), dst_node_id=1, message_type=MessageType.TRAIN)  # an unpacked message passes through
    assert not is_packed(wire_mod(plain, context, handler).content)


def test_a_run_through_the_packed_wire_computes_the_same_model(tmp_path):
    config = {"out-dir": str(tmp_path), "num-server-rounds": 2, "batch-size": 8}
    plain_dir, _ = run_in_process(config | {"run-name": "plain"})
    packed_dir, grid = run_in_process(config | {"run-name": "packed"}, polling=True)
    train = [m for m in grid.sent if m.metadata.message_type == "train"]
    assert train and all(is_packed(m.content) for m in train)  # what crossed the (local) wire was packed
    plain, packed = load_file(str(plain_dir / "model.safetensors")), load_file(str(packed_dir / "model.safetensors"))
    assert plain.keys() == packed.keys() and all(np.array_equal(plain[k], packed[k]) for k in plain)
    rounds = [json.loads((d / "metrics.json").read_text())["rounds"] for d in (plain_dir, packed_dir)]
    for key in ("central-accuracy", "eval-accuracy", "train-loss", "bytes-up", "bytes-down", "messages"):
        assert [r.get(key) for r in rounds[0]] == [r.get(key) for r in rounds[1]], key
