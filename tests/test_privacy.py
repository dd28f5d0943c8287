"""Differential privacy (dp.*): client clipping and local noise, central noise on the aggregate, config checks, the
label attack under clipping, and what the wire shows to the audit."""

from __future__ import annotations

import json

import numpy as np
import pytest

from clients.privacy import local_epsilon, privatize
from core.config import ConfigError, DPConfig, parse_config
from tests.helpers import run_in_process


def norm(arrays: dict[str, np.ndarray]) -> float:
    return float(np.sqrt(sum((np.asarray(a, np.float64) ** 2).sum() for a in arrays.values())))


def random_arrays(seed: int, scale: float) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "w": (scale * rng.normal(size=(40, 30))).astype(np.float32),
        "b": (scale * rng.normal(size=7)).astype(np.float32),
    }


def test_fedsgd_gradients_are_clipped_as_the_step_the_server_takes():
    received, grad = random_arrays(0, 1.0), random_arrays(1, 0.1)
    dp = DPConfig(mode="central", clipping_norm=0.01)
    out, metrics = privatize(grad, received, dp, sends_gradient=True, lr=0.02)
    assert norm({n: 0.02 * out[n] for n in out}) == pytest.approx(0.01, rel=1e-5)  # lr·g clipped to C
    cosine = sum((out[n].astype(np.float64) * grad[n]).sum() for n in grad) / (norm(out) * norm(grad))
    assert cosine == pytest.approx(1.0, abs=1e-6)  # clipping only rescales: the direction is on the wire
    assert metrics["dp-clipped"] == 1.0 and metrics["dp-update-norm"] == pytest.approx(0.02 * norm(grad), rel=1e-6)
    small, metrics = privatize(grad, received, DPConfig(mode="central", clipping_norm=100.0), True, 0.02)
    assert metrics["dp-clipped"] == 0.0
    assert all(np.allclose(small[n], grad[n], rtol=1e-6, atol=1e-9) for n in grad)  # float64 round trip


def test_fedavg_weights_are_clipped_and_local_noise_has_the_configured_std():
    received = random_arrays(0, 1.0)
    new = {n: received[n] + 0.5 * v for n, v in random_arrays(2, 1.0).items()}
    dp = DPConfig(mode="local", clipping_norm=0.1, noise_multiplier=2.0)
    out, metrics = privatize(new, received, dp, sends_gradient=False, lr=0.02)
    delta = np.concatenate([(out[n].astype(np.float64) - received[n]).ravel() for n in new])
    assert metrics["dp-noise-std"] == pytest.approx(0.2)
    assert np.std(delta) == pytest.approx(0.2, rel=0.1)  # 1,207 entries; the clipped update is tiny beside the noise
    assert local_epsilon(dp) == pytest.approx(np.sqrt(2 * np.log(1.25e5)) / 2.0)


def test_dp_config_is_checked():
    assert parse_config({"dp.mode": "local", "dp.noise-multiplier": 0.01}).dp.noise_multiplier == 0.01
    with pytest.raises(ConfigError, match="dp.mode"):
        parse_config({"dp.mode": "central", "strategy": "masked-fedsgd"})
    with pytest.raises(ConfigError, match="dp.clipping-norm"):
        parse_config({"dp.clipping-norm": 1.0})  # set but DP off: refused, never silently ignored
    with pytest.raises(ConfigError, match="dp.delta"):
        parse_config({"dp.mode": "local", "dp.delta": 0.0})


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


def test_label_attack_estimates_the_clip_scale(tmp_path):
    from attacks.benchmark import DEFENCES, Setting, client_update_and_labels, defence_config, partitions
    from attacks.labels import label_accuracy, recover_labels

    base = parse_config({"audit.iterations": 5, "audit.restarts": 1})
    config = defence_config(base, DEFENCES["dp-central"], 2, tmp_path, Setting(8))
    obs, _, labels = client_update_and_labels(config, 0, partitions(config, Setting(8), 2), seed_key=1000)
    counts, reason = recover_labels(obs)
    assert reason == "clip scale estimated" and counts.sum() == 8
    assert label_accuracy(counts, labels) >= 0.75
