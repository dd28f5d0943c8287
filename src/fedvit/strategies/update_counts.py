"""How often each parameter was updated, against theory (random-binary-weights paper, Sec. IV-D, eq. 13, Fig. 6)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from scipy import stats

from fedvit.core.params import PARAM_ROLES

GROUPS = {
    "all": None,
    "position-embedding": PARAM_ROLES["position-embedding"],
    "patch-embedding": PARAM_ROLES["patch-embedding"],
}


def update_count_pmf(m: int, n: int, r: float, locked: bool = False) -> np.ndarray:
    """P(f), f = 0..m: probability that a parameter is updated in f of m rounds with n clients.

    A parameter is updated in a round unless all n clients drew B = 0, which has
    probability R^n. Fresh masks (independent rounds)::

        P(f) = C(m, f) (1 − R^n)^f (R^n)^(m − f)

    The paper's eq. 13 prints the last factor as R^{n(1−f)}, a typo: with f
    updates there are m − f rounds without one, hence R^{n(m−f)}.
    Locked masks repeat round 1's outcome, so f ∈ {0, m}: P(m) = 1 − R^n, P(0) = R^n.
    """
    p_update = 1.0 - r**n
    if locked:
        pmf = np.zeros(m + 1)
        pmf[m], pmf[0] = p_update, 1.0 - p_update
        return pmf
    return stats.binom.pmf(np.arange(m + 1), m, p_update)


def histogram(update_counts: dict[str, np.ndarray], m: int, names: tuple[str, ...] | None) -> np.ndarray:
    """Number of parameters (entries) updated f times, f = 0..m, over ``names`` (None: all)."""
    chosen = [v.ravel() for k, v in update_counts.items() if names is None or k in names]
    return np.bincount(np.concatenate(chosen), minlength=m + 1)[: m + 1] if chosen else np.zeros(m + 1, int)


def expected_pmf(
    update_counts: dict[str, np.ndarray],
    rates: dict[str, float],
    m: int,
    n: int,
    names: tuple[str, ...] | None,
    locked: bool,
) -> np.ndarray:
    """Theory for a group: the size-weighted mixture of each parameter's P(f) at its own R."""
    mix, total = np.zeros(m + 1), 0
    for name, counts in update_counts.items():
        if names is None or name in names:
            mix += counts.size * update_count_pmf(m, n, rates[name], locked)
            total += counts.size
    return mix / max(total, 1)


def chi_square_pvalue(observed: np.ndarray, pmf: np.ndarray, min_expected: float = 5.0) -> float:
    """Pearson chi-square goodness of fit; bins with expected < ``min_expected`` are pooled."""
    expected = pmf * observed.sum()
    keep = expected >= min_expected
    obs = np.append(observed[keep], observed[~keep].sum())
    exp = np.append(expected[keep], expected[~keep].sum())
    if exp[-1] == 0:  # nothing pooled
        obs, exp = obs[:-1], exp[:-1]
    if len(obs) < 2:
        return 1.0 if np.allclose(obs, exp) else 0.0
    return float(stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue)


def write_update_count_report(
    update_counts: dict[str, np.ndarray],
    clients_per_round: list[int],
    rates: dict[str, float],
    run_dir: Path,
    locked: bool = False,
) -> dict:
    """Write ``update-counts.json`` and ``plots/update-counts.png`` (empirical vs theory per group)."""
    m = len(clients_per_round)
    if m == 0:
        return {}
    n = int(np.median(clients_per_round))
    report = {"rounds": m, "clients-per-round": clients_per_round, "theory-clients": n, "groups": {}}
    for group, names in GROUPS.items():
        observed = histogram(update_counts, m, names)
        pmf = expected_pmf(update_counts, rates, m, n, names, locked)
        report["groups"][group] = {
            "parameters": int(observed.sum()),
            "empirical": (observed / max(observed.sum(), 1)).tolist(),
            "theory": pmf.tolist(),
            "chi-square-p": chi_square_pvalue(observed, pmf),
        }
    (run_dir / "update-counts.json").write_text(json.dumps(report, indent=2))
    plot_update_counts({"this run": report}, run_dir / "plots" / "update-counts.png")
    return report


def plot_update_counts(reports: dict[str, dict], path: Path) -> None:
    """Fig. 6 analogue: per group, empirical P(f) as bars and theory as markers, one row per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(len(reports), len(GROUPS), figsize=(4 * len(GROUPS), 2.8 * len(reports)), squeeze=False)
    for row, (label, report) in enumerate(reports.items()):
        for col, group in enumerate(GROUPS):
            ax, data = axes[row][col], report["groups"][group]
            f = np.arange(len(data["empirical"]))
            ax.bar(f, data["empirical"], color="tab:blue", alpha=0.6, label="measured")
            ax.plot(f, data["theory"], "o", color="tab:red", label="theory (corrected eq. 13)")
            ax.set_title(f"{label}: {group}", fontsize=9)
            ax.set_xlabel("update count f")
            ax.set_ylabel("P(f)")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
