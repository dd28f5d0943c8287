"""Canary clients and the accountant (fedvit.strategies.canaries): the estimator on synthetic changes of known
signal, the accountant's conversion, and a central-DP run that writes both."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedvit.strategies import canaries


def test_the_gaussian_curve_and_its_inverse_agree_and_grow_with_the_signal():
    for mu in (0.3, 1.0, 3.0, 10.0):
        epsilon = canaries.gaussian_epsilon(mu, 1e-5)
        assert epsilon > 0 and canaries.gaussian_delta(epsilon, mu) == pytest.approx(1e-5, rel=1e-4)
    assert canaries.gaussian_epsilon(0.0, 1e-5) == 0.0 and canaries.gaussian_epsilon(-1.0, 1e-5) == 0.0
    values = [canaries.gaussian_epsilon(mu, 1e-5) for mu in (0.5, 1, 2, 4)]
    assert values == sorted(values)
    # the Gaussian mechanism with σ = 1/μ is (ε, δ)-DP for σ ≥ √(2 ln(1.25/δ))/ε (Dwork & Roth, Thm. A.1): the
    # exact curve needs no more ε than that classic bound
    assert canaries.gaussian_epsilon(0.5, 1e-5) <= 0.5 * np.sqrt(2 * np.log(1.25 / 1e-5))


def test_the_accountant_is_the_best_renyi_order():
    orders = np.linspace(1.001, 400, 400_000)
    for sigma, rounds in ((1.0, 10), (4.0, 100), (0.5, 3)):
        best = np.min(rounds * orders / (2 * sigma**2) + np.log(1 / 1e-5) / (orders - 1))
        assert canaries.accountant_epsilon(sigma, rounds, 1e-5) == pytest.approx(best, rel=1e-4)
    assert canaries.accountant_epsilon(0.0, 5, 1e-5) == np.inf


def test_the_estimate_reads_a_known_signal_and_finds_none_where_there_is_none():
    """A change with a·Σu_i planted in noise of spread s per direction: μ ≈ a/s; without the canaries' term, ≈ 0."""
    dimension, count, seed, a, s = 20_000, 60, 7, 3.0, 1.0
    total = canaries.canary_sum(dimension, count, seed)
    noise = np.random.default_rng(0).standard_normal(dimension) * s
    found = canaries.estimate(a * total + noise, count, seed, 1e-5)
    assert found["mu"] == pytest.approx(a / s, rel=0.25), found
    assert found["epsilon-estimate"] == pytest.approx(canaries.gaussian_epsilon(found["mu"], 1e-5))
    blank = canaries.estimate(noise, count, seed, 1e-5)
    assert abs(blank["mu"]) < 0.6 and blank["epsilon-estimate"] < found["epsilon-estimate"] / 3, blank


def test_canaries_join_the_aggregate_as_clients_of_the_mean_weight():
    start, aggregate, total = np.zeros(4), np.full(4, 2.0), np.array([1.0, 0, 0, 0])
    mixed = canaries.with_canaries(aggregate, start, total, clipping_norm=0.5, clients=3, count=2)
    np.testing.assert_allclose(mixed, (3 * aggregate + 0.5 * total) / 5)


@pytest.mark.parametrize("noise_multiplier", [0.2, 8.0])
def test_a_central_dp_run_writes_the_accountants_epsilon_and_the_canaries_estimate(tmp_path, noise_multiplier):
    """Two rounds, 3 clients and 200 canaries: each canary's direction carries C/(n+k) per round against noise of
    σC/(n+k), so the estimate's μ is √2/σ up to its sampling error (≈ √(2/200)); the accountant's ε is the formula's.
    (Flower's noise draws from NumPy's global generator: seeded here.)"""
    from tests.helpers import run_in_process

    np.random.seed(0)
    config = {"out-dir": str(tmp_path), "run-name": "dp", "num-server-rounds": 2, "batch-size": 8,
              "dp.mode": "central", "dp.noise-multiplier": noise_multiplier, "dp.clipping-norm": 0.01,
              "dp.canaries": 200}  # fmt: skip
    run_dir, _ = run_in_process(config)
    rounds = json.loads((run_dir / "metrics.json").read_text())["rounds"]
    assert all(r["dp-central-noise-std"] == pytest.approx(noise_multiplier * 0.01 / 203) for r in rounds
               if r["round"] >= 1)  # fmt: skip
    report = json.loads((run_dir / "dp-privacy.json").read_text())
    assert report["releases"] == 2 and report["canaries"] == 200 and report["clients-per-round"] == 3
    assert report["accountant-epsilon"] == pytest.approx(canaries.accountant_epsilon(noise_multiplier, 2, 1e-5))
    assert report["mu"] == pytest.approx(np.sqrt(2) / noise_multiplier, abs=0.35), report
    assert report["epsilon-estimate"] == pytest.approx(canaries.gaussian_epsilon(report["mu"], 1e-5))


def test_canaries_need_central_dp_and_a_fresh_run():
    from fedvit.core.config import ConfigError, parse_config

    with pytest.raises(ConfigError, match="dp.canaries"):
        parse_config({"dp.mode": "local", "dp.canaries": 4})
    with pytest.raises(ConfigError, match="dp.canaries"):
        parse_config({"dp.mode": "central", "dp.canaries": 4, "resume-from": "somewhere"})
    assert parse_config({"dp.mode": "central", "dp.canaries": 4}).dp.canaries == 4
