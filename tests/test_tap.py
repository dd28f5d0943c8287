"""The wire tap: Messages rebuilt from Fleet API bodies, faults survived, bytes relayed unchanged."""

from __future__ import annotations

import errno
import json
import socket
import threading
import time

import httpx
import numpy as np
import pytest
import uvicorn
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.app.message import make_message
from flwr.common.serde import message_to_proto
from flwr.proto.fleet_pb2 import (  # pylint: disable=E0611
    PullMessagesRequest,
    PullMessagesResponse,
    PushMessagesRequest,
    PushMessagesResponse,
)
from flwr.proto.message_pb2 import (  # pylint: disable=E0611
    PullObjectRequest,
    PullObjectResponse,
    PushObjectRequest,
    PushObjectResponse,
)
from flwr.proto.node_pb2 import Node  # pylint: disable=E0611
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects, get_object_tree
from safetensors.numpy import load_file
from starlette.applications import Starlette
from starlette.responses import Response
from starlette.routing import Route

from fedvit.app.tap import running_tap, sniff, split_address
from fedvit.capture.wire_tap import WireRecorder
from tests.helpers import reply_metadata

NODE = 7


def instruction(weights: dict[str, np.ndarray], server_round: int) -> Message:
    """A train instruction as Flower's FedAvg sends it: arrays + a ConfigRecord with lr and server-round."""
    content = RecordDict(
        {
            "arrays": ArrayRecord({k: Array(v) for k, v in weights.items()}),
            "config": ConfigRecord({"lr": 0.1, "server-round": server_round}),
        }
    )
    msg = Message(content, dst_node_id=NODE, message_type="train")
    msg.metadata.__dict__["_message_id"] = msg.object_id  # as the grid does when it pushes it
    return msg


def answer(ins: Message, weights: dict[str, np.ndarray], examples: int) -> Message:
    meta = reply_metadata(NODE, "train")
    meta.__dict__.update(_reply_to_message_id=ins.metadata.message_id, _run_id=ins.metadata.run_id)
    content = RecordDict(
        {
            "arrays": ArrayRecord({k: Array(v) for k, v in weights.items()}),
            "metrics": MetricRecord({"num-examples": examples, "train_loss": 1.5}),
        }
    )
    msg = make_message(meta, content=content)
    msg.metadata.__dict__["_message_id"] = msg.object_id
    return msg


def pull_exchanges(msg: Message) -> list[tuple[str, bytes, bytes, int]]:
    """The bodies a SuperNode's pull of ``msg`` puts on the wire: pull-messages, then one pull-object per object."""
    node = Node(node_id=NODE)
    out = [
        (
            "/v1/fleet/pull-messages",
            PullMessagesRequest(node=node).SerializeToString(),
            PullMessagesResponse(
                messages_list=[message_to_proto(msg)], message_object_trees=[get_object_tree(msg)]
            ).SerializeToString(),
            200,
        )
    ]
    for object_id, obj in get_all_nested_objects(msg).items():
        request = PullObjectRequest(node=node, run_id=msg.metadata.run_id, object_id=object_id)
        response = PullObjectResponse(object_found=True, object_available=True, object_content=obj.deflate())
        out.append(("/v1/fleet/pull-object", request.SerializeToString(), response.SerializeToString(), 200))
    return out


def push_exchanges(msg: Message, server_has: set[str] = frozenset()) -> list[tuple[str, bytes, bytes, int]]:
    """push-messages, then push-object for each object the SuperLink does not hold yet."""
    node = Node(node_id=NODE)
    objects = get_all_nested_objects(msg)
    wanted = [i for i in objects if i not in server_has]
    request = PushMessagesRequest(node=node, messages_list=[message_to_proto(msg)],
                                  message_object_trees=[get_object_tree(msg)])  # fmt: skip
    out = [("/v1/fleet/push-messages", request.SerializeToString(),
            PushMessagesResponse(objects_to_push=wanted).SerializeToString(), 200)]  # fmt: skip
    for object_id in wanted:
        request = PushObjectRequest(node=node, run_id=msg.metadata.run_id, object_id=object_id,
                                    object_content=objects[object_id].deflate())  # fmt: skip
        out.append(("/v1/fleet/push-object", request.SerializeToString(), PushObjectResponse(stored=True)
                    .SerializeToString(), 200))  # fmt: skip
    return out


def weights(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"conv.weight": rng.normal(size=(4, 3, 3, 3)).astype(np.float32), "fc.bias": np.zeros(10, np.float32)}


def test_recorder_rebuilds_a_round_from_the_wire(tmp_path):
    sent_w, new_w = weights(0), weights(1)
    new_w["fc.bias"] = sent_w["fc.bias"].copy()  # unchanged array: the SuperLink already holds it, never pushed
    ins = instruction(sent_w, server_round=3)
    rep = answer(ins, new_w, examples=4)
    recorder = WireRecorder(tmp_path)
    pulled = pull_exchanges(ins)
    for path, req, resp, status in pulled:
        recorder.handle(path, req, resp, status)
    server_has = set(get_all_nested_objects(ins))
    for path, req, resp, status in push_exchanges(rep, server_has):
        recorder.handle(path, req, resp, status)
    stem = tmp_path / f"run-{ins.metadata.run_id}" / "captures" / "round-0003" / f"node-{NODE}"
    manifest = json.loads(stem.with_name(stem.name + ".json").read_text())
    assert manifest["round"] == 3 and manifest["node"] == NODE and manifest["observer"] == "wire-tap"
    assert manifest["received"]["config"]["config"] == {"lr": 0.1, "server-round": 3}
    assert manifest["sent"]["metrics"]["metrics"]["num-examples"] == 4
    received = load_file(stem.with_name(stem.name + ".received.safetensors"))
    sent = load_file(stem.with_name(stem.name + ".sent.safetensors"))
    for name in sent_w:
        np.testing.assert_array_equal(received[f"arrays/{name}"], sent_w[name])
        np.testing.assert_array_equal(sent[f"arrays/{name}"], new_w[name])
    assert recorder.stats["received"] == 1 and recorder.stats["sent"] == 1
    recorder.close()


def test_malformed_and_truncated_objects_are_counted_and_recording_goes_on(tmp_path):
    recorder = WireRecorder(tmp_path)
    ins = instruction(weights(0), 1)
    exchanges = pull_exchanges(ins)
    path, req, resp, status = exchanges[1]
    good = PullObjectResponse.FromString(resp)
    truncated = PullObjectResponse(object_found=True, object_available=True,
                                   object_content=good.object_content[:-5]).SerializeToString()  # fmt: skip
    for bad in (truncated, b"\x0a\xff\xff garbage"):
        recorder.observe(path, req, bad, status)
    for exchange in exchanges:
        recorder.observe(*exchange)
    recorder.close()
    assert recorder.stats["parse-errors"] == 2
    assert recorder.stats["received"] == 1  # the valid copy still completes the message


def test_full_disk_is_counted_not_raised(tmp_path, monkeypatch):
    import fedvit.capture.wire_tap as wire_tap

    def no_space(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(wire_tap, "add_direction", no_space)
    recorder = WireRecorder(tmp_path)
    for exchange in pull_exchanges(instruction(weights(0), 1)) + pull_exchanges(instruction(weights(2), 2)):
        recorder.observe(*exchange)
    recorder.close()
    assert recorder.stats["write-errors"] == 2
    assert recorder.stats["received"] == 0


def test_addresses_and_sniffing():
    assert split_address("127.0.0.1:9092") == ("127.0.0.1", 9092)
    assert split_address("[::1]:80") == ("::1", 80)
    for bad in ("localhost", ":80", "host:0", "host:http"):
        with pytest.raises(ValueError, match="HOST:PORT"):
            split_address(bad)
    assert sniff(b"\x16\x03\x01\x02\x00") == "tls"
    assert sniff(b"PRI * HTTP/2.0\r\n") == "http2"
    assert sniff(b"POST /v1/fleet/pull-messages HTTP/1.1") == "http"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def upstream():
    """A stand-in SuperLink: echoes the request body and headers back (so forwarding can be checked exactly)."""
    seen = []

    async def echo(request):
        body = await request.body()
        seen.append((request.url.path, dict(request.headers), body))
        headers = {"x-signed": request.headers.get("x-signature", ""), "content-type": "application/protobuf"}
        return Response(content=b"echo:" + body, headers=headers)

    app = Starlette(routes=[Route("/{path:path}", echo, methods=["POST", "GET"])])
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    yield f"127.0.0.1:{port}", seen
    server.should_exit = True
    thread.join(10)


def test_proxy_forwards_bytes_and_headers_unchanged_and_survives_garbage(tmp_path, upstream):
    address, seen = upstream
    listen = f"127.0.0.1:{free_port()}"
    with running_tap(listen, address, tmp_path) as tap:
        with httpx.Client(base_url=f"http://{listen}") as client:
            body = bytes(range(256)) * 10
            r = client.post("/v1/fleet/push-object?x=1", content=body, headers={"x-signature": "sig123"})
            assert r.status_code == 200 and r.content == b"echo:" + body
            assert r.headers["x-signed"] == "sig123"
            # a malformed push-object: relayed to the SuperLink, logged and counted by the tap
            r = client.post("/v1/fleet/push-object", content=b"\xff\xff not protobuf")
            assert r.status_code == 200
    assert seen[0][0] == "/v1/fleet/push-object" and seen[0][1]["x-signature"] == "sig123" and seen[0][2] == body
    assert seen[1][2] == b"\xff\xff not protobuf"
    summary = json.loads((tmp_path / "tap.json").read_text())
    assert summary["connections"]["http"] >= 1
    assert summary["records"]["parse-errors"] == 2 and summary["records"]["requests"] == 2
    assert tap.recorder.stats["received"] == 0


def test_tls_is_relayed_as_bytes_with_metadata_only(tmp_path):
    """A TLS ClientHello is not HTTP: relayed byte for byte to the upstream, recorded as connection metadata."""
    port = free_port()
    server = socket.create_server(("127.0.0.1", port))
    got = []

    def serve_once():
        conn, _ = server.accept()
        data = b""
        while len(data) < len(hello):  # a byte stream: the tap may deliver it in pieces
            data += conn.recv(4096)
        got.append(data)
        conn.sendall(b"\x16\x03\x03server-hello")
        conn.close()

    hello = b"\x16\x03\x01\x00\x10client-hello-bytes"
    threading.Thread(target=serve_once, daemon=True).start()
    listen = f"127.0.0.1:{free_port()}"
    with running_tap(listen, f"127.0.0.1:{port}", tmp_path):
        with socket.create_connection(split_address(listen)) as conn:
            conn.sendall(hello)
            answer_bytes = conn.recv(4096)
        time.sleep(0.3)
    server.close()
    assert got == [hello] and answer_bytes == b"\x16\x03\x03server-hello"
    entries = [json.loads(line) for line in (tmp_path / "connections.jsonl").read_text().splitlines()]
    assert entries[0]["protocol"] == "tls" and entries[0]["readable"] is False
    assert entries[0]["bytes-up"] == len(hello)
    assert not (tmp_path / "run-1").exists()


def fab_bundle() -> bytes:
    """A FAB as ``flwr build`` makes one: a zip archive of the app's pyproject.toml and code."""
    import io
    import zipfile
    from pathlib import Path

    app = Path(__file__).parent / "headapp"
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as bundle:
        for path in sorted(app.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                bundle.write(path, path.relative_to(app).as_posix())
    return buffer.getvalue()


def test_the_app_bundle_a_node_fetches_is_kept_once_by_its_hash_and_named_in_run_json(tmp_path):
    """get-fab: the FAB's content kept under fabs/<sha256>.fab (a second node's fetch adds nothing), run.json names
    it beside the run config fused from its defaults; a bundle whose content does not hash to its name is not
    kept."""
    import hashlib

    from flwr.proto.fab_pb2 import Fab, GetFabRequest, GetFabResponse  # pylint: disable=E0611
    from flwr.proto.run_pb2 import GetRunRequest, GetRunResponse  # pylint: disable=E0611
    from flwr.proto.run_pb2 import Run as ProtoRun  # pylint: disable=E0611

    from fedvit.capture.reader import _app_code, _run_file
    from fedvit.observed.app_code import load_app, read_code

    content = fab_bundle()
    digest = hashlib.sha256(content).hexdigest()
    run = ProtoRun(run_id=11, fab_id="thirdparty/vithead", fab_version="1.0.0", fab_hash=digest)
    recorder = WireRecorder(tmp_path)
    recorder.handle("/v1/fleet/get-run", GetRunRequest(run_id=11).SerializeToString(),
                    GetRunResponse(run=run).SerializeToString(), 200)  # fmt: skip
    for _ in range(2):  # two nodes fetch the same bundle
        recorder.handle("/v1/fleet/get-fab", GetFabRequest(hash_str=digest, run_id=11).SerializeToString(),
                        GetFabResponse(fab=Fab(hash_str=digest, content=content)).SerializeToString(), 200)  # fmt: skip
    kept = tmp_path / "fabs" / f"{digest}.fab"
    assert kept.read_bytes() == content and recorder.stats["fabs"] == 1
    info = json.loads((tmp_path / "run-11" / "run.json").read_text())
    assert info["fab-file"] == f"fabs/{digest}.fab" and info["run_config"]["lr"] == 0.001
    stem = tmp_path / "run-11" / "captures" / "round-0001" / "node-7"
    assert _app_code(*_run_file(stem), {}) == kept
    code = read_code(load_app(kept), {"run config": info["run_config"]})
    assert code.optimiser.value == "adam" and code.lr.value == 0.001
    forged = b"not the bundle"
    recorder.handle("/v1/fleet/get-fab", GetFabRequest(hash_str="ab" * 32, run_id=12).SerializeToString(),
                    GetFabResponse(fab=Fab(hash_str="ab" * 32, content=forged)).SerializeToString(), 200)  # fmt: skip
    assert not (tmp_path / "fabs" / f"{'ab' * 32}.fab").exists() and recorder.stats["fabs"] == 1
    recorder.close()
