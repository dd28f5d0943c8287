import numpy as np
import pytest
from flwr.app import Array, ArrayRecord
from flwr.serverapp.strategy import FedAvg as FlowerFedAvg

from fedvit.strategies import FedAvg, FedSGD
from fedvit.strategies.fedsgd import fedsgd_update
from tests.helpers import FakeGrid, reply

SHAPES = {"w": (2, 2), "b": (3,)}


def global_record(value=1.0):
    return ArrayRecord({k: Array(np.full(s, value, np.float32)) for k, s in SHAPES.items()})


def prepared(strategy, partition_of):
    grid = FakeGrid(partition_of)
    list(strategy.configure_train(1, global_record(), __import__("flwr.app").app.ConfigRecord(), grid))
    return grid


def test_fedsgd_eq10_hand_computed():
    w = {"w": np.array([1.0, 2.0], np.float32)}
    grads = [{"w": np.array([1.0, 0.0], np.float32)}, {"w": np.array([3.0, -4.0], np.float32)}]
    # mean gradient = [2, -2]; w - 0.5 * mean = [0, 3]
    out = fedsgd_update(w, grads, lr=0.5)
    np.testing.assert_array_equal(out["w"], np.array([0.0, 3.0], np.float32))
    assert out["w"].dtype == np.float32


def test_fedsgd_strategy_applies_eq10_over_valid_replies():
    s = FedSGD(lr=0.1, min_nodes=1)
    prepared(s, {11: 0, 12: 1, 13: 2})
    g0 = {"w": np.full((2, 2), 1.0, np.float32), "b": np.zeros(3, np.float32)}
    g1 = {"w": np.full((2, 2), 3.0, np.float32), "b": np.full(3, 2.0, np.float32)}
    bad = {"w": np.full((2, 2), np.nan, np.float32), "b": np.zeros(3, np.float32)}
    replies = [
        reply(12, g1, **{"num-examples": 4}),
        reply(11, g0, **{"num-examples": 4}),
        reply(13, bad, **{"num-examples": 4}),
    ]
    arrays, metrics = s.aggregate_train(1, replies)
    np.testing.assert_allclose(arrays["w"].numpy(), 1.0 - 0.1 * 2.0)
    np.testing.assert_allclose(arrays["b"].numpy(), 1.0 - 0.1 * 1.0)
    assert 2 in s.stats[1].rejected and "NaN" in s.stats[1].rejected[2]
    assert metrics["num-examples"] == 8


@pytest.mark.parametrize(
    "bad_reply, reason",
    [
        (reply(11, {"w": np.zeros((2, 3), np.float32), "b": np.zeros(3, np.float32)}, **{"num-examples": 1}), "shape"),
        (
            reply(11, {"w": np.zeros((2, 2), np.float64), "b": np.zeros(3, np.float32)}, **{"num-examples": 1}),
            "float32",
        ),
        (reply(11, {"w": np.zeros((2, 2), np.float32)}, **{"num-examples": 1}), "missing"),
        (
            reply(11, {"w": np.zeros((2, 2), np.float32), "b": np.zeros(3, np.float32)}, **{"num-examples": 0}),
            "num-examples",
        ),
        (
            reply(11, error="Traceback (most recent call last):\n  File x\nValueError: boom"),
            "error 2: ValueError: boom",
        ),
    ],
)
def test_invalid_replies_are_rejected_and_model_kept(bad_reply, reason):
    s = FedSGD(lr=0.1, min_nodes=1)
    prepared(s, {11: 0, 12: 1})
    also_invalid = reply(12, {"w": np.zeros(4, np.float32), "b": np.zeros(3, np.float32)}, **{"num-examples": 1})
    arrays, metrics = s.aggregate_train(1, [bad_reply, also_invalid])
    assert arrays is None and metrics is None  # Strategy.start keeps the previous global model
    assert reason in s.stats[1].rejected[0]


def node_unavailable(sent, node: int):
    """The SuperLink's error-5 reply (it comes from node 1) to the instruction ``sent`` to ``node``."""
    from flwr.app import Error
    from flwr.app.message import make_message

    from tests.helpers import reply_metadata

    for i, msg in enumerate(sent):  # what the Grid does when pushing
        msg.metadata.__dict__["_message_id"] = f"m{i}"
    dead = next(m for m in sent if m.metadata.dst_node_id == node)
    meta = reply_metadata(1, "train")
    meta.__dict__["_reply_to_message_id"] = dead.metadata.message_id
    return make_message(meta, error=Error(code=5, reason="Node Unavailable"))


def test_superlink_generated_error_is_attributed_to_the_node_that_failed():
    """Error 5 (node unavailable) comes from the SuperLink (node 1): the rejection names the dead partition."""
    s = FedSGD(lr=0.1, min_nodes=1)
    grid = FakeGrid({11: 0, 12: 1})
    sent = list(s.configure_train(1, global_record(), __import__("flwr.app").app.ConfigRecord(), grid))
    unavailable = node_unavailable(sent, 12)
    ok = reply(11, {k: np.ones(v, np.float32) for k, v in SHAPES.items()}, **{"num-examples": 2})
    arrays, _ = s.aggregate_train(1, [unavailable, ok])
    assert arrays is not None
    assert s.stats[1].rejected == {1: "error 5: Node Unavailable"}


def test_a_round_where_every_client_failed_stops_the_run():
    from fedvit.strategies.base import ClientsFailedError

    s = FedSGD(lr=0.1, min_nodes=1)
    prepared(s, {11: 0, 12: 1})
    with pytest.raises(ClientsFailedError, match="all 2 clients failed .*TypeError: bad"):
        s.aggregate_train(1, [reply(11, error="x\nTypeError: bad"), reply(12, error="y\nTypeError: bad")])


def test_accept_failures_false_stops_a_round_short_of_any_client():
    """accept-failures=false: one failed reply (or one missing at the timeout) stops the run before aggregating;
    the default aggregates the others."""
    from fedvit.strategies.base import ClientsFailedError

    ok = reply(11, {k: np.ones(v, np.float32) for k, v in SHAPES.items()}, **{"num-examples": 2})
    failed = reply(12, error="x\nTypeError: bad")
    strict = FedSGD(lr=0.1, min_nodes=1, accept_failures=False)
    prepared(strict, {11: 0, 12: 1})
    with pytest.raises(ClientsFailedError, match="1 of 2 sampled clients .*partition 1: error 2: TypeError: bad"):
        strict.aggregate_train(1, [ok, failed])
    strict = FedSGD(lr=0.1, min_nodes=1, accept_failures=False)
    prepared(strict, {11: 0, 12: 1})
    with pytest.raises(ClientsFailedError, match="1 of 2 sampled .*replies missing at the timeout"):
        strict.aggregate_train(1, [ok])
    lenient = FedSGD(lr=0.1, min_nodes=1)
    prepared(lenient, {11: 0, 12: 1})
    assert lenient.aggregate_train(1, [ok, failed])[0] is not None
    assert lenient.stats[1].aggregated == [0] and lenient.stats[1].sampled == [0, 1]


def test_a_round_that_loses_clients_to_a_superlink_restart_is_aggregated_only_when_failures_are_accepted():
    """After a SuperLink restart the sampled nodes' instructions come back "node unavailable" (error 5, from the
    SuperLink) or not at all. The policy (docs/deploy.md): by default the round is aggregated from the replies that
    arrived, and metrics.json says which (``aggregated``); with accept-failures=false it is not aggregated, the run
    stops and a resume redoes the round with every client."""
    from fedvit.strategies.base import ClientsFailedError

    def lost_round(strategy: FedSGD):
        grid = FakeGrid({11: 0, 12: 1, 13: 2})
        strategy.discover(grid)
        sent = list(strategy.configure_train(2, global_record(), __import__("flwr.app").app.ConfigRecord(), grid))
        unavailable = node_unavailable(sent, 12)
        ok = reply(11, {k: np.ones(v, np.float32) for k, v in SHAPES.items()}, **{"num-examples": 2})
        return strategy.aggregate_train(2, [unavailable, ok])  # node 13's reply never came

    lenient = FedSGD(lr=0.1, min_nodes=1)
    assert lost_round(lenient)[0] is not None
    assert lenient.stats[2].aggregated == [0] and lenient.stats[2].sampled == [0, 1, 2]
    strict = FedSGD(lr=0.1, min_nodes=1, accept_failures=False)
    with pytest.raises(ClientsFailedError, match="round 2: 1 of 3 sampled clients .*partition 1: error 5"):
        lost_round(strict)
    assert strict.stats[2].aggregated == []


def test_fedavg_matches_flowers_fedavg_on_same_replies():
    rng = np.random.default_rng(0)
    replies = [
        reply(
            node,
            {k: rng.normal(size=s).astype(np.float32) for k, s in SHAPES.items()},
            **{"num-examples": n, "train-loss": float(n)},
        )
        for node, n in [(21, 10), (22, 30), (23, 7)]
    ]
    ours = FedAvg(min_nodes=1)
    prepared(ours, {21: 0, 22: 1, 23: 2})
    mine, _ = ours.aggregate_train(1, replies)
    theirs, _ = FlowerFedAvg().aggregate_train(1, replies)
    for k in SHAPES:
        np.testing.assert_array_equal(mine[k].numpy(), theirs[k].numpy())


def test_sampling_is_seeded_and_independent_of_node_ids():
    def sampled(seed, partition_of, rnd):
        s = FedSGD(lr=0.1, seed=seed, fraction_train=0.5, min_nodes=1)
        nodes = s.sample(FakeGrid(partition_of), rnd, s.fraction_train, stream=0)
        return sorted(s.partition_of[n] for n in nodes)

    a = {100 + i: i for i in range(10)}
    b = {9000 - 7 * i: i for i in range(10)}  # other node ids, same partitions
    assert sampled(3, a, 1) == sampled(3, b, 1)
    assert len(sampled(3, a, 1)) == 5
    rounds = {tuple(sampled(3, a, r)) for r in range(1, 8)}
    assert len(rounds) > 1  # different rounds sample differently
    assert sampled(3, a, 1) != sampled(4, a, 1) or sampled(3, a, 2) != sampled(4, a, 2)


def test_discovery_queries_each_node_once():
    s = FedSGD(lr=0.1, min_nodes=2)
    grid = FakeGrid({1: 0, 2: 1})
    s.discover(grid)
    s.discover(grid)
    assert grid.queries == 2 and s.partition_of == {1: 0, 2: 1}


def test_waiting_for_nodes_times_out_with_clear_error():
    from fedvit.strategies.base import NodesUnavailableError

    s = FedSGD(lr=0.1, min_nodes=3, wait_timeout=0.01)
    with pytest.raises(NodesUnavailableError, match="min-nodes=3"):
        s.discover(FakeGrid({1: 0}))


class ScriptedGrid(FakeGrid):
    """A FakeGrid whose discovery replies are given per node (to send malformed ones)."""

    def __init__(self, infos: dict[int, dict | None]) -> None:
        super().__init__({node: 0 for node in infos})
        self.infos = infos

    def send_and_receive(self, messages, *, timeout=None):
        from flwr.app import ConfigRecord, RecordDict
        from flwr.app.message import make_message

        from tests.helpers import reply_metadata

        out = []
        for msg in messages:
            self.queries += 1
            node = msg.metadata.dst_node_id
            info = self.infos[node]
            content = RecordDict() if info is None else RecordDict({"config": ConfigRecord(info)})
            out.append(make_message(reply_metadata(node, "query"), content=content))
        return out


@pytest.fixture
def flower_log():
    """Flower's log lines (its logger does not propagate to pytest's caplog)."""
    import logging

    from flwr.common.logger import FLOWER_LOGGER

    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    FLOWER_LOGGER.addHandler(handler)
    yield lines
    FLOWER_LOGGER.removeHandler(handler)


def test_a_second_node_claiming_a_partition_id_is_refused_by_name(flower_log):
    s = FedSGD(lr=0.1, min_nodes=2)
    grid = FakeGrid({1: 0, 2: 1, 3: 1})
    assert s.discover(grid) == {1: 0, 2: 1}
    assert [line for line in flower_log if "refused" in line] == [
        "node 3 refused: partition-id 1 is already held by node 2 (give every SuperNode its own --node-config "
        "partition-id)"
    ]
    assert s.discover(grid) == {1: 0, 2: 1} and sum("refused" in line for line in flower_log) == 1  # logged once
    assert 3 not in s.sample(grid, 1, 1.0, stream=0)
    del grid.partition_of[2]  # node 2 leaves (a restarted SuperNode comes back under a new node id)
    assert s.discover(grid) == {1: 0, 3: 1}
    assert grid.queries == 3  # nobody was asked twice


def test_malformed_discovery_replies_exclude_the_node_instead_of_crashing(flower_log):
    good = {"partition-id": 0, "num-partitions": 4, "num-classes": 10}
    grid = ScriptedGrid(
        {
            1: good,
            2: None,  # no config record at all
            3: {"partition-id": 2, "num-partitions": 4},  # no num-classes
            4: good | {"partition-id": "3"},  # not an integer
            5: good | {"partition-id": 7},  # outside [0, num-partitions)
            6: good | {"partition-id": 1},
        }
    )
    s = FedSGD(lr=0.1, min_nodes=2)
    assert s.discover(grid) == {1: 0, 6: 1}
    assert sorted(s.excluded) == [2, 3, 4, 5] and "num-classes" in s.excluded[3]
    assert sum("excluded" in line for line in flower_log) == 4
    s.discover(grid)
    assert grid.queries == 6  # excluded nodes are not asked again


def test_a_run_with_two_nodes_on_one_partition_trains_on_the_others(tmp_path):
    from tests.helpers import run_in_process

    config = {"run-name": "dup", "out-dir": str(tmp_path), "num-server-rounds": 1, "min-nodes": 2}
    run_dir, grid = run_in_process(config, 3, node_config={2: {"partition-id": 1}})
    trained = {m.metadata.dst_node_id for m in grid.sent if m.metadata.message_type == "train"}
    assert trained == {100, 101}  # node 102 claimed partition 1 too and was never sampled
    assert (run_dir / "metrics.json").is_file()
