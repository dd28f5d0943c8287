"""Differential privacy (dp.*): client clipping and local noise, central noise on the aggregate, config checks, the
label attack under clipping, and what the wire shows to the audit."""

from __future__ import annotations

import json

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MessageType, MetricRecord, RecordDict

from fedvit.clients.privacy import dp_mod, local_epsilon
from fedvit.core.config import ConfigError, parse_config
from tests.helpers import run_in_process


def norm(arrays: dict[str, np.ndarray]) -> float:
    return float(np.sqrt(sum((np.asarray(a, np.float64) ** 2).sum() for a in arrays.values())))


def random_arrays(seed: int, scale: float) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "w": (scale * rng.normal(size=(40, 30))).astype(np.float32),
        "b": (scale * rng.normal(size=7)).astype(np.float32),
    }


def through_dp_mod(run_config: dict, received: dict, sent: dict, config: dict | None = None) -> Message:
    """A train message with ``received`` through the ClientApp's dp_mod, the handler replying ``sent``."""
    record = ConfigRecord({"server-round": 1, "lr": 0.02, **(config or {})})
    msg = Message(
        RecordDict({"arrays": ArrayRecord({k: Array(v) for k, v in received.items()}), "config": record}),
        dst_node_id=1,
        message_type=MessageType.TRAIN,
    )

    def handler(m: Message, _context: Context) -> Message:
        content = RecordDict({"arrays": ArrayRecord({k: Array(v) for k, v in sent.items()})})
        content["metrics"] = MetricRecord({"num-examples": 8})
        return Message(content, reply_to=m)

    context = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config=run_config)
    return dp_mod(msg, context, handler)


def arrays_of(msg: Message) -> dict[str, np.ndarray]:
    return {k: a.numpy() for k, a in msg.content["arrays"].items()}


def test_fedsgd_gradients_are_clipped_by_flowers_mod_as_the_step_the_server_takes():
    received, grad = random_arrays(0, 1.0), random_arrays(1, 0.1)
    central = {"dp.mode": "central", "dp.clipping-norm": 0.01}
    out = through_dp_mod(central, received, grad, {"clipping_norm": 0.01})  # the key Flower's server wrapper sends
    clipped, metrics = arrays_of(out), out.content["metrics"]
    assert all(a.dtype == np.float32 for a in clipped.values())
    assert norm({n: 0.02 * clipped[n] for n in clipped}) == pytest.approx(0.01, rel=1e-5)  # lr·g clipped to C
    cosine = sum((clipped[n].astype(np.float64) * grad[n]).sum() for n in grad) / (norm(clipped) * norm(grad))
    assert cosine == pytest.approx(1.0, abs=1e-6)  # clipping only rescales: the direction is on the wire
    assert metrics["dp-clipped"] == 1.0 and metrics["dp-update-norm"] == pytest.approx(0.02 * norm(grad), rel=1e-6)
    out = through_dp_mod(central | {"dp.clipping-norm": 100.0}, received, grad, {"clipping_norm": 100.0})
    assert out.content["metrics"]["dp-clipped"] == 0.0
    assert all(np.allclose(arrays_of(out)[n], grad[n], rtol=1e-6, atol=1e-9) for n in grad)  # float64 round trip
    refused = through_dp_mod(central, received, grad)  # no clipping norm from the server: Flower's mod refuses
    assert refused.has_error() and "clipping_norm" in refused.error.reason


def test_fedavg_weights_are_clipped_and_local_noise_has_the_configured_std():
    received = random_arrays(0, 1.0)
    new = {n: received[n] + 0.5 * v for n, v in random_arrays(2, 1.0).items()}
    local = {"strategy": "fedavg", "dp.mode": "local", "dp.clipping-norm": 0.1, "dp.noise-multiplier": 2.0}
    out = through_dp_mod(local, received, new)
    delta = np.concatenate([(arrays_of(out)[n].astype(np.float64) - received[n]).ravel() for n in new])
    assert out.content["metrics"]["dp-noise-std"] == pytest.approx(0.2)  # LocalDpMod's std with σ = 2, C = 0.1
    assert np.std(delta) == pytest.approx(0.2, rel=0.1)  # 1,207 entries; the clipped update is tiny beside the noise
    assert local_epsilon(parse_config(local).dp) == pytest.approx(np.sqrt(2 * np.log(1.25e5)) / 2.0)


def test_other_messages_and_dp_off_pass_unchanged():
    received, grad = random_arrays(0, 1.0), random_arrays(1, 0.1)
    out = through_dp_mod({}, received, grad)
    assert all(np.array_equal(arrays_of(out)[n], grad[n]) for n in grad) and "dp-clipped" not in out.content["metrics"]


def test_a_failed_client_makes_flowers_wrapper_skip_the_round_and_fedvit_records_why():
    from fedvit.strategies import FedSGD
    from fedvit.strategies.base import ClientsFailedError
    from fedvit.strategies.privacy import CentralDP
    from tests.helpers import FakeGrid, reply
    from tests.test_strategies import global_record

    dp = parse_config({"dp.mode": "central", "dp.clipping-norm": 0.5}).dp
    strategy = FedSGD(lr=0.1, min_nodes=1)
    driver = CentralDP(strategy, dp, num_sampled_clients=2)
    sent = list(driver.configure_train(1, global_record(), ConfigRecord(), FakeGrid({11: 0, 12: 1})))
    assert all(m.content["config"]["clipping_norm"] == 0.5 for m in sent)  # the wrapper tells the clients C
    ok = reply(11, {"w": np.zeros((2, 2), np.float32), "b": np.zeros(3, np.float32)}, **{"num-examples": 4})
    arrays, _ = driver.aggregate_train(1, [ok, reply(12, error="x\nValueError: boom")])
    assert arrays is None and "ValueError: boom" in strategy.stats[1].rejected[1]
    with pytest.raises(ClientsFailedError):
        driver.aggregate_train(1, [reply(11, error="x\nTypeError: a"), reply(12, error="y\nTypeError: b")])


def test_dp_config_is_checked():
    assert parse_config({"dp.mode": "local", "dp.noise-multiplier": 0.01}).dp.noise_multiplier == 0.01
    with pytest.raises(ConfigError, match="dp.mode"):
        parse_config({"dp.mode": "central", "strategy": "masked-fedsgd"})
    with pytest.raises(ConfigError, match="dp.clipping-norm"):
        parse_config({"dp.clipping-norm": 1.0})  # set but DP off: refused, never silently ignored
    with pytest.raises(ConfigError, match="dp.delta"):
        parse_config({"dp.mode": "local", "dp.delta": 0.0})
    with pytest.raises(ConfigError, match="dp.mode.*encrypted"):
        parse_config({"dp.mode": "local", "encryption.mode": "paper", "centralized-evaluation": False})


def test_central_dp_run_clips_on_clients_and_noises_the_aggregate(tmp_path):
    config = {"out-dir": str(tmp_path), "run-name": "dp", "num-server-rounds": 2, "batch-size": 8,
              "dp.mode": "central", "dp.noise-multiplier": 1.0, "dp.clipping-norm": 0.01}  # fmt: skip
    run_dir, grid = run_in_process(config)
    rounds = json.loads((run_dir / "metrics.json").read_text())["rounds"]
    trained = [r for r in rounds if r["round"] >= 1]
    assert all(r["dp-central-noise-std"] == pytest.approx(1.0 * 0.01 / 3) for r in trained)
    assert all(r["dp-clipped"] == 1.0 for r in trained)  # lr·g of a batch of 8 is far above 0.01
    replies = [m for m in grid.received if m.metadata.message_type == "train"]
    steps = [0.02 * norm({n: a.numpy() for n, a in m.content["arrays"].items()}) for m in replies]
    assert steps and all(s == pytest.approx(0.01, rel=1e-4) for s in steps)  # the wire carries clipped updates
    sent = {m.content["config"]["server-round"]: m for m in grid.sent if m.metadata.message_type == "train"}
    assert sent[1].content["config"]["clipping_norm"] == 0.01  # from Flower's wrapper
    before, after = arrays_of(sent[1]), arrays_of(sent[2])
    first = [arrays_of(m) for m in replies[:3]]
    noise = np.concatenate(
        [
            (after[n].astype(np.float64) - before[n] + 0.02 * np.mean([g[n] for g in first], axis=0)).ravel()
            for n in before
        ]
    )
    assert np.std(noise) == pytest.approx(0.01 / 3, rel=0.05)  # the aggregate got N(0, (σC/n)²) on every entry


def test_label_attack_estimates_the_clip_scale(tmp_path):
    from fedvit.attacks.labels import label_accuracy, recover_labels
    from fedvit.audit.benchmark import DEFENCES, Setting, client_update_and_labels, defence_config, partitions

    base = parse_config({"audit.iterations": 5, "audit.restarts": 1})
    config = defence_config(base, DEFENCES["dp-central"], 2, tmp_path, Setting(8))
    obs, _, labels = client_update_and_labels(config, 0, partitions(config, Setting(8), 2), seed_key=1000)
    counts, reason = recover_labels(obs)
    assert reason == "clip scale estimated" and counts.sum() == 8
    assert label_accuracy(counts, labels) >= 0.75


def test_the_offline_path_lends_flowers_task_identity_only_while_it_needs_one():
    from flwr.supercore.task_identity import TaskIdentity

    from fedvit.clients.privacy import privatize_offline

    config = parse_config({"dp.mode": "central", "dp.clipping-norm": 0.01})
    received, grad = random_arrays(0, 1.0), random_arrays(1, 0.1)
    TaskIdentity.run_id = TaskIdentity.node_id = TaskIdentity.task_id = None  # as in `fedvit audit --benchmark`
    records, metrics = privatize_offline(config, received, {"arrays": grad}, {"num-examples": 8}, lr=0.02)
    with pytest.raises(RuntimeError):
        TaskIdentity.run_id  # noqa: B018 - unset again afterwards
    assert norm({n: 0.02 * a for n, a in records["arrays"].items()}) == pytest.approx(0.01, rel=1e-5)
    assert metrics["dp-clipped"] == 1.0 and metrics["num-examples"] == 8
