"""Report of a federated adversarial training grid in the FedWAvg paper's format (Tables 1-3, Fig. 2).

The grid has the axes ``partition``, ``aggregator`` and ``training`` (values ``NT`` and ``AT``); each cell is one
run in ``<out>/<partition>.<aggregator>.<training>/``. NT cells report the best accuracy; AT cells the best robust
accuracy and the accuracy of the same round, "(accuracy, robust accuracy)", as in the paper.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

AXES = ("partition", "aggregator", "training")
TRAININGS = ("NT", "AT")


def _rounds(run_dir: Path) -> list[dict[str, Any]]:
    return json.loads((run_dir / "metrics.json").read_text())["rounds"]


def _series(rounds: list[dict[str, Any]]) -> dict[str, list[tuple[int, float]]]:
    """Per-round accuracy and robust accuracy (central when the run had it, else federated)."""
    source = "central" if any("central-accuracy" in r for r in rounds) else "eval"
    out = {}
    keys = {"accuracy": "accuracy", "robust": "robust-accuracy", "autoattack": "autoattack-accuracy"}
    for name, key in keys.items():
        out[name] = [(r["round"], r[f"{source}-{key}"]) for r in rounds if f"{source}-{key}" in r]
    return out


def _autoattack_version(rounds: list[dict[str, Any]]) -> str | None:
    """The AutoAttack version of the run's last round that says what it ran (metrics.json ``autoattack``)."""
    described = [r["autoattack"]["version"] for r in rounds if "autoattack" in r]
    return described[-1] if described else None


def cell_result(run_dir: Path, training: str) -> dict[str, Any] | None:
    """NT: best accuracy. AT: the round with the best robust accuracy, its accuracy and robust accuracy. Both:
    AutoAttack robust accuracy of the last round that has it (``robust.attack = "autoattack"``: the final round).
    None when the run has no results (not run yet, or failed)."""
    if not (run_dir / "metrics.json").exists():
        return None
    rounds = _rounds(run_dir)
    series = _series(rounds)
    autoattack = dict([series["autoattack"][-1]] if series["autoattack"] else [(None, None)])
    ((aa_round, aa),) = autoattack.items()
    measured = {"autoattack": aa, "autoattack-round": aa_round, "autoattack-version": _autoattack_version(rounds)}
    if training == "NT" or not series["robust"]:
        best_round, best = max(series["accuracy"], key=lambda p: p[1])
        return {"round": best_round, "accuracy": best, "robust": None, **measured}
    best_round, robust = max(series["robust"], key=lambda p: p[1])
    accuracy = dict(series["accuracy"]).get(best_round)
    return {"round": best_round, "accuracy": accuracy, "robust": robust, **measured}


def _check_grid(grid: dict[str, dict[str, str]]) -> None:
    if tuple(grid) != AXES or set(grid["training"]) != set(TRAININGS):
        raise ValueError(f"a FAT grid needs the axes {AXES} in this order and training values {TRAININGS}")


def fat_table(out: Path, grid: dict[str, dict[str, str]]) -> tuple[str, dict]:
    """Markdown table (rows: aggregators; per partition an NT and an AT column) and the raw numbers."""
    _check_grid(grid)
    partitions, aggregators = list(grid["partition"]), list(grid["aggregator"])
    results = {
        (p, a, t): cell_result(out / f"{p}.{a}.{t}", t) for p in partitions for a in aggregators for t in TRAININGS
    }
    header = "| aggregator | " + " | ".join(f"{p} NT | {p} AT | {p} AT AutoAttack" for p in partitions) + " |"
    lines = [header, "|---|" + "---|---|---|" * len(partitions)]
    ranks = {}  # per partition: aggregators by robust accuracy, for the paper's bold / underline marks
    for p in partitions:
        order = sorted(aggregators, key=lambda a: -((results[(p, a, "AT")] or {}).get("robust") or -1))
        ranks[p] = {a: i for i, a in enumerate(order)}
    for a in aggregators:
        cells = []
        for p in partitions:
            nt, at = results[(p, a, "NT")], results[(p, a, "AT")]
            cells.append("not run" if nt is None else f"{100 * nt['accuracy']:.2f}")
            if at is None:
                cells += ["not run", "not run"]
                continue
            robust = "–" if at["robust"] is None else f"{100 * at['robust']:.2f}"
            robust = {0: f"**{robust}**", 1: f"<u>{robust}</u>"}.get(ranks[p][a], robust) if at["robust"] else robust
            cells.append(f"({100 * at['accuracy']:.2f}, {robust})")
            version = f"{at['autoattack-version']}, " if at["autoattack-version"] else ""
            aa_round = at["autoattack-round"]
            cells.append(
                "–" if at["autoattack"] is None else f"{100 * at['autoattack']:.2f} ({version}round {aa_round})"
            )
        lines.append(f"| {a} | " + " | ".join(cells) + " |")
    raw = {".".join(k): v for k, v in results.items()}
    return "\n".join(lines), raw


def plot_fig2(out: Path, grid: dict[str, dict[str, str]]) -> Path:
    """Fig. 2 analogue: accuracy per round under NT (top), accuracy and robust accuracy under AT, per partition."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    partitions, aggregators = list(grid["partition"]), list(grid["aggregator"])
    rows = [("NT", "accuracy", "NT accuracy (%)"), ("AT", "accuracy", "AT accuracy (%)"),
            ("AT", "robust", "AT robust accuracy (%)")]  # fmt: skip
    fig, axes = plt.subplots(len(rows), len(partitions), figsize=(4 * len(partitions), 9), squeeze=False)
    for col, p in enumerate(partitions):
        for row, (training, metric, ylabel) in enumerate(rows):
            ax = axes[row][col]
            for a in aggregators:
                run_dir = out / f"{p}.{a}.{training}"
                points = _series(_rounds(run_dir))[metric] if (run_dir / "metrics.json").exists() else []
                if points:
                    rounds, values = zip(*points, strict=True)
                    ax.plot(rounds, [100 * v for v in values], label=a)
            ax.set_title(f"{p}" if row == 0 else "")
            ax.set_xlabel("round")
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    path = out / "fig2.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_fat_report(out: Path, grid: dict[str, dict[str, str]]) -> str:
    """``fat-table.md``, ``fat-table.json`` and ``fig2.png`` in ``out``; returns the table."""
    table, raw = fat_table(out, grid)
    weight_plots = sorted(str(p.relative_to(out)) for p in out.glob("*/plots/fedwavg-weights.png"))
    note = (
        "\n\nNT: best accuracy (%). AT: (accuracy, robust accuracy) (%) at the round of the best robust accuracy "
        "(the run's PGD, `robust.*`); **first** and <u>second</u> best robust accuracy per partition marked. "
        "AT AutoAttack: AutoAttack robust accuracy (%) of the last round that has it (`robust.attack = "
        '"autoattack"`: the final round), on the same images and ε, with the version run (`standard`: APGD-CE, '
        "APGD-T, FAB-T, Square; `apgd`: APGD-CE + APGD-T); – where the run did not measure it.\n"
    )
    if weight_plots:
        note += "FedWAvg weights per round (Fig. 1 analogue): " + ", ".join(weight_plots) + "\n"
    (out / "fat-table.md").write_text(table + note)
    (out / "fat-table.json").write_text(json.dumps(raw, indent=2))
    plot_fig2(out, grid)
    return table + note
