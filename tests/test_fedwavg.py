"""FedWAvg (FedWAvg paper, eq. 3): weights, aggregation, validation and a whole run."""

import json
import math

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord
from flwr.serverapp.strategy.strategy_utils import aggregate_arrayrecords

from fedvit.core.config import Config, ConfigError, parse_config
from fedvit.strategies import FedWAvg
from fedvit.strategies.fedwavg import fedwavg_weights
from tests.helpers import FakeGrid, reply, run_in_process

NAMES = ("head.weight", "head.bias")


def test_weights_by_hand():
    """g = (1, 0); l1 = (2, 0): c = 1; l2 = (0, 3): c = 0; q = 1: w = (e, 1) / (e + 1)."""
    w, c = fedwavg_weights(np.array([1.0, 0.0]), [np.array([2.0, 0.0]), np.array([0.0, 3.0])], q=1.0)
    np.testing.assert_allclose(c, [1.0, 0.0])
    np.testing.assert_allclose(w, [math.e / (math.e + 1), 1 / (math.e + 1)])
    w10, _ = fedwavg_weights(np.array([1.0, 0.0]), [np.array([2.0, 0.0]), np.array([0.0, 3.0])], q=10.0)
    np.testing.assert_allclose(w10, [math.e**10 / (math.e**10 + 1), 1 / (math.e**10 + 1)])


def test_identical_clients_and_q0_give_uniform_weights_and_a_zero_global_is_finite():
    rng = np.random.default_rng(0)
    v = rng.normal(size=5)
    w, _ = fedwavg_weights(rng.normal(size=5), [v, v.copy(), v.copy()], q=10.0)
    np.testing.assert_allclose(w, [1 / 3] * 3)
    w, _ = fedwavg_weights(rng.normal(size=5), [rng.normal(size=5) for _ in range(4)], q=0.0)
    np.testing.assert_allclose(w, [0.25] * 4)
    w, c = fedwavg_weights(np.zeros(5), [rng.normal(size=5) for _ in range(3)], q=5.0)
    assert np.isfinite(w).all() and w.sum() == pytest.approx(1.0) and not c.any()
    w, _ = fedwavg_weights(rng.normal(size=5), [1e6 * rng.normal(size=5) for _ in range(3)], q=1e4)
    assert np.isfinite(w).all() and w.sum() == pytest.approx(1.0)


def _strategy(q: float) -> FedWAvg:
    s = FedWAvg(q=q, last_layer_names=NAMES)
    s.discover(FakeGrid({1: 0, 2: 1, 3: 2}))
    return s


def _arrays(rng, scale=1.0):
    return {
        "head.weight": scale * rng.normal(size=(3, 4)).astype(np.float32),
        "head.bias": scale * rng.normal(size=3).astype(np.float32),
        "x": rng.normal(size=2).astype(np.float32),
    }


def _train(strategy, global_arrays, replies):
    strategy.global_arrays = ArrayRecord({k: Array(v) for k, v in global_arrays.items()})
    strategy._expected = {k: v.shape for k, v in global_arrays.items()}
    return strategy.aggregate_train(1, replies)


def test_q0_equals_flowers_fedavg_on_equal_sample_counts():
    rng = np.random.default_rng(1)
    clients = [_arrays(rng) for _ in range(3)]
    replies = [reply(i + 1, c, **{"num-examples": 10}) for i, c in enumerate(clients)]
    got, _ = _train(_strategy(0.0), _arrays(rng), replies)
    expected = aggregate_arrayrecords([r.content for r in replies], "num-examples")
    for name in expected:
        np.testing.assert_allclose(got[name].numpy(), expected[name].numpy(), rtol=1e-6, atol=1e-7)


def test_aggregate_is_the_weighted_sum_and_bad_last_layers_are_rejected_with_a_reason():
    rng = np.random.default_rng(2)
    g = _arrays(rng)
    good = [_arrays(rng), _arrays(rng)]
    zero = _arrays(rng)
    zero["head.weight"][:] = 0
    zero["head.bias"][:] = 0
    nan = _arrays(rng)
    nan["head.bias"][0] = np.nan
    strategy = _strategy(1.0)
    replies = [
        reply(1, good[0], **{"num-examples": 5}),
        reply(2, good[1], **{"num-examples": 50}),
        reply(3, zero, **{"num-examples": 5}),
    ]
    got, _ = _train(strategy, g, replies)
    assert "zero norm" in strategy.stats[1].rejected[2]
    last = [np.concatenate([c["head.weight"].ravel(), c["head.bias"].ravel()]).astype(np.float64) for c in good]
    gl = np.concatenate([g["head.weight"].ravel(), g["head.bias"].ravel()]).astype(np.float64)
    w, _ = fedwavg_weights(gl, last, 1.0)
    for name in g:
        np.testing.assert_allclose(got[name].numpy(), w[0] * good[0][name] + w[1] * good[1][name], rtol=1e-5)
    assert strategy.stats[1].aggregation["weights"] == {"0": pytest.approx(w[0]), "1": pytest.approx(w[1])}
    strategy = _strategy(1.0)
    _train(strategy, g, [reply(1, good[0], **{"num-examples": 5}), reply(2, nan, **{"num-examples": 5})])
    assert "NaN" in strategy.stats[1].rejected[1]


def test_config_rules():
    with pytest.raises(ConfigError, match="fedwavg.q"):
        parse_config({"fedwavg.q": 2.0})
    with pytest.raises(ConfigError, match="fedwavg.q"):
        parse_config({"strategy": "fedwavg", "fedwavg.q": -1.0})
    assert parse_config({"strategy": "fedwavg", "fedwavg.q": 10.0}).fedwavg.last_layer_names == NAMES


def test_a_fedwavg_run_logs_weights_every_round_and_plots_them(tmp_path):
    config = Config().to_dict() | {
        "strategy": "fedwavg",
        "num-server-rounds": 2,
        "out-dir": str(tmp_path),
        "run-name": "w",
        "lr": 0.05,
        "fedwavg.q": 10.0,
    }
    run_dir, _ = run_in_process(config)
    rounds = json.loads((run_dir / "metrics.json").read_text())["rounds"]
    for entry in rounds[1:]:
        weights = entry["aggregation"]["weights"]
        assert set(weights) == {"0", "1", "2"} and sum(weights.values()) == pytest.approx(1.0)
    assert (run_dir / "plots" / "fedwavg-weights.png").is_file()
    with pytest.raises(ConfigError, match="not found"):
        run_in_process(config | {"run-name": "bad", "fedwavg.last-layer": "head.nope"})
