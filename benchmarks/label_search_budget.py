"""The label estimate's class-mix search under a smaller budget: its error against its cost, per model and cap.

The audit's search takes up to :data:`~fedvit.attacks.label_distribution.SEARCH_STEPS` Gauss–Newton steps from each
of its two starts, each step one simulated local training per class (its Jacobian) and up to three more (the step
length). ``label_distribution.py --search-steps`` re-runs the label table's client updates with the search capped
at K steps per start; this joins those rows with the committed table (the audit's own cap, the attack's draw 0) and
summarises them per model and cap: median and worst error (over every row, and over clients of at least 1,000
images, the rows the audit's quoted error rests on), how far the rows moved from the table, the simulations run
and the label seconds (two rows at a time, one thread each).

    uv run python -m benchmarks.label_distribution --workers 2 --epochs 1 --search-steps 0,1,2,3,5 --out FILE.csv
    uv run python -m benchmarks.label_search_budget FILE.csv   # writes label-search-budget{,-summary}.csv
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import numpy as np

from benchmarks.common import write_csv
from benchmarks.label_distribution import OUT as TABLE
from benchmarks.label_spread import DATA, QUOTED_FROM, key, read


def summary(rows: list[dict], table: dict[tuple, dict]) -> list[dict]:
    """Per model, epoch count and cap: the error's median and worst, the moves from the committed table's row of
    the same client update, the mean simulations and the summed label seconds."""
    out = []
    models = list(dict.fromkeys(r["model"] for r in rows))  # in the rows' order
    groups = {(r["model"], int(r["local epochs"]), int(r["search steps"])) for r in rows}
    for model, epochs, cap in sorted(groups, key=lambda g: (models.index(g[0]), g[1], g[2])):
        mine = [r for r in rows if (r["model"], int(r["local epochs"]), int(r["search steps"])) == (model, epochs, cap)]
        errors = np.array([float(r["label error"]) for r in mine])
        quoted = np.array([float(r["label error"]) for r in mine if int(r["images"]) >= QUOTED_FROM])
        moved = np.array([100 * abs(float(r["label error"]) - float(table[key(r)]["label error"])) for r in mine])
        out.append({
            "model": model, "local epochs": epochs, "search steps": cap, "rows": len(mine),
            "median error": round(float(np.median(errors)), 4), "worst error": round(float(errors.max()), 4),
            f"worst error, ≥ {QUOTED_FROM:,} images": round(float(quoted.max()), 4) if len(quoted) else None,
            "median move from the table (points)": round(float(np.median(moved)), 2),
            "largest move from the table (points)": round(float(moved.max()), 2),
            "rows as in the table": int((moved == 0).sum()),
            "mean simulations": round(float(np.mean([int(r["simulations"]) for r in mine])), 1),
            "label s, summed": round(sum(float(r["label s"]) for r in mine), 1),
        })  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("budget", type=Path, help="label_distribution's rows under --search-steps")
    parser.add_argument("--table", type=Path, default=TABLE, help="the committed table (the audit's cap, draw 0)")
    parser.add_argument("--out", type=Path, default=DATA / "label-search-budget.csv", help="the rows, copied")
    parser.add_argument("--summary", type=Path, default=DATA / "label-search-budget-summary.csv")
    args = parser.parse_args()
    with args.budget.open() as f:
        rows = list(csv.DictReader(f))
    if not rows or "search steps" not in rows[0]:
        raise SystemExit(f"{args.budget} holds no --search-steps rows (label_distribution --search-steps K,...)")
    if any("attack draw" in r and r["attack draw"] not in ("", "0") for r in rows):
        raise SystemExit(f"{args.budget} is another draw of the attack: the table it is read against is draw 0")
    table = read(args.table)
    if missing := sorted({key(r) for r in rows} - table.keys()):
        raise SystemExit(f"client updates the table does not hold, e.g. {missing[:3]} ({len(missing)} in all)")
    write_csv(rows, args.out)
    found = summary(rows, table)
    write_csv(found, args.summary)
    for r in found:
        print(r)


if __name__ == "__main__":
    main()
