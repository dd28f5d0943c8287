"""Canary clients: an empirical ε of a central-DP run from the run itself (Andrew et al., "One-shot Empirical
Privacy Estimation for Federated Learning", ICLR 2024, arXiv 2302.03098).

k canary clients join every round's aggregate beside the sampled clients, each sending the same update: the clipping
norm C times its own random unit direction u_i in the model's parameter space, drawn from a server-side seed and
never sent anywhere. The round's noise is calibrated to the n + k updates. After the last round, the cosine of each
canary's direction with the model's change over the run (final − initial) is compared with the cosines of k
directions that never joined: a canary that left a trace shows a larger cosine. With Gaussians fitted to both,
the estimate is the ε at δ of telling N(μ₀, σ²) from N(μ₁, σ²), μ = (μ₁ − μ₀)/σ with σ the unseen directions'
spread: the Gaussian mechanism's exact (ε, δ) curve, δ(ε) = Φ(μ/2 − ε/μ) − e^ε Φ(−μ/2 − ε/μ) (Balle & Wang, "Improving
the Gaussian Mechanism for Differential Privacy", ICML 2018, Thm. 8). It is an estimate, not a bound: set beside the
accountant's ε, a larger one says the accounting (or the implementation) is wrong.

The accountant: Rényi DP of the Gaussian mechanism, α/(2σ²) per released round, composed over the T rounds and
converted at δ, ε = min_α T α/(2σ²) + ln(1/δ)/(α − 1) = ρ + 2√(ρ ln(1/δ)) with ρ = T/(2σ²) (Mironov, "Rényi
Differential Privacy", CSF 2017, Prop. 3 and 7), no amplification by sampling (every round is counted as if each
client took part).
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
from scipy.optimize import brentq
from scipy.stats import norm

UNSEEN_OFFSET = 1_000_003  # the unseen directions' seeds: after every canary's


def directions(dimension: int, seeds: range) -> Iterator[np.ndarray]:
    """One random unit vector of ``dimension`` entries per seed (float64; isotropic: a normalised Gaussian)."""
    for seed in seeds:
        u = np.random.default_rng(seed).standard_normal(dimension)
        yield u / np.linalg.norm(u)


def canary_sum(dimension: int, count: int, seed: int) -> np.ndarray:
    """Σ_i u_i over the ``count`` canaries of run seed ``seed`` (the same every round: kept, not the directions)."""
    total = np.zeros(dimension)
    for u in directions(dimension, canary_seeds(count, seed)):
        total += u
    return total


def canary_seeds(count: int, seed: int) -> range:
    return range(seed * 10_000_019 + 1, seed * 10_000_019 + 1 + count)


def unseen_seeds(count: int, seed: int) -> range:
    first = seed * 10_000_019 + 1 + UNSEEN_OFFSET
    return range(first, first + count)


def with_canaries(aggregate: np.ndarray, start: np.ndarray, canaries: np.ndarray, clipping_norm: float, clients: int,
                  count: int) -> np.ndarray:  # fmt: skip
    """The aggregate of ``clients`` clients with ``count`` canaries beside them, each a client whose new weights are
    start + C·u_i with the clients' mean weight: start + (clients·(aggregate − start) + C·Σu_i) / (clients + count)."""
    return start + (clients * (aggregate - start) + clipping_norm * canaries) / (clients + count)


def gaussian_delta(epsilon: float, mu: float) -> float:
    """δ(ε) of telling N(0, 1) from N(μ, 1) (Balle & Wang 2018, Thm. 8)."""
    if mu <= 0:
        return 0.0
    return float(norm.cdf(mu / 2 - epsilon / mu) - math.exp(epsilon) * norm.cdf(-mu / 2 - epsilon / mu))


def gaussian_epsilon(mu: float, delta: float) -> float:
    """The smallest ε ≥ 0 with δ(ε) ≤ ``delta`` for N(0, 1) against N(μ, 1) (0 where μ ≤ 0 or δ(0) ≤ δ)."""
    if mu <= 0 or gaussian_delta(0.0, mu) <= delta:
        return 0.0
    high = 1.0
    while gaussian_delta(high, mu) > delta:
        high *= 2
    return float(brentq(lambda e: gaussian_delta(e, mu) - delta, 0.0, high, xtol=1e-9))


def estimate(change: np.ndarray, count: int, seed: int, delta: float) -> dict[str, float | int]:
    """The one-shot ε estimate from the model's change over the run (see the module docstring)."""
    unit = change / max(float(np.linalg.norm(change)), 1e-300)
    seen = np.array([float(u @ unit) for u in directions(len(change), canary_seeds(count, seed))])
    unseen = np.array([float(u @ unit) for u in directions(len(change), unseen_seeds(count, seed))])
    spread = float(unseen.std(ddof=1))
    mu = (float(seen.mean()) - float(unseen.mean())) / max(spread, 1e-300)
    return {
        "canaries": count,
        "canary-cosine-mean": float(seen.mean()),
        "canary-cosine-std": float(seen.std(ddof=1)),
        "unseen-cosine-mean": float(unseen.mean()),
        "unseen-cosine-std": spread,
        "mu": mu,
        "delta": delta,
        "epsilon-estimate": gaussian_epsilon(mu, delta),
    }


def accountant_epsilon(noise_multiplier: float, releases: int, delta: float) -> float:
    """ε at δ of ``releases`` Gaussian releases with noise multiplier σ (see the module docstring; ∞ for σ = 0)."""
    if noise_multiplier <= 0:
        return math.inf
    rho = releases / (2 * noise_multiplier**2)
    return rho + 2 * math.sqrt(rho * math.log(1 / delta))
