"""The label estimate's own run-to-run spread: the committed label-distribution table (the attack's draw 0) beside
the same client updates under another draw of the attack's simulations (other auxiliary images in each simulated
batch, other shuffles, another other-draw check; the client's update unchanged), joined row by row; then, per model
and epoch count, how far the rows moved and the worst error over both draws (clients of at least 1,000 images, the
rows the audit's quoted error rests on).

    uv run python -m benchmarks.label_distribution --workers 2 --attack-draw 1 --out /tmp/draw-1.csv  # ~90 min
    uv run python -m benchmarks.label_spread /tmp/draw-1.csv   # writes label-distribution-spread{,-summary}.csv
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import numpy as np

from benchmarks.common import ROOT, write_csv
from benchmarks.label_distribution import OUT as DRAW_0

DATA = ROOT / "docs" / "results" / "data"
KEY = ("model", "partition", "client seed", "images", "local epochs")
QUOTED_FROM = 1000  # the audit quotes the worst error over clients of at least this many images


def key(row: dict) -> tuple:
    """The client update a row holds: its :data:`KEY` values."""
    return tuple(row[k] for k in KEY)


def read(path: Path) -> dict[tuple, dict]:
    """A table's rows by their client update (:func:`key`)."""
    with path.open() as f:
        return {key(r): r for r in csv.DictReader(f)}


def joined(first: dict[tuple, dict], second: dict[tuple, dict], draw: int) -> list[dict]:
    """One row per client update in both tables; a row missing from either is an error (not a smaller table)."""
    if first.keys() != second.keys():
        missing = sorted(first.keys() ^ second.keys())
        raise SystemExit(f"the two tables hold different client updates, e.g. {missing[:3]} ({len(missing)} in all)")
    rows = []
    for key, a in first.items():
        b = second[key]
        rows.append(dict(zip(KEY, key, strict=True)) | {
            "prior error": a["prior error"],
            "label error draw 0": a["label error"], f"label error draw {draw}": b["label error"],
            "moved (points)": round(100 * abs(float(b["label error"]) - float(a["label error"])), 2),
            "momentum draw 0": a["momentum estimated"], f"momentum draw {draw}": b["momentum estimated"],
        })  # fmt: skip
    return rows


def summary(rows: list[dict], draw: int) -> list[dict]:
    """Per model and epoch count: the largest and median move over every row and over the quoted rows, and the
    worst error of the quoted rows under each draw and over both."""
    out = []
    for model in dict.fromkeys(r["model"] for r in rows):
        for epochs in sorted({int(r["local epochs"]) for r in rows if r["model"] == model}):
            mine = [r for r in rows if r["model"] == model and int(r["local epochs"]) == epochs]
            quoted = [r for r in mine if int(r["images"]) >= QUOTED_FROM]
            moved = np.array([r["moved (points)"] for r in mine])
            moved_quoted = np.array([r["moved (points)"] for r in quoted])
            worst = {d: max(float(r[f"label error draw {d}"]) for r in quoted) for d in (0, draw)}
            out.append({
                "model": model, "local epochs": epochs, "rows": len(mine),
                "largest move (points)": round(float(moved.max()), 2),
                "median move (points)": round(float(np.median(moved)), 2),
                f"largest move, ≥ {QUOTED_FROM:,} images (points)": round(float(moved_quoted.max()), 2),
                f"worst error draw 0, ≥ {QUOTED_FROM:,} images": worst[0],
                f"worst error draw {draw}, ≥ {QUOTED_FROM:,} images": worst[draw],
                "worst of both": max(worst.values()),
            })  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("other", type=Path, help="the table under another draw (label_distribution --attack-draw)")
    parser.add_argument("--draw", type=int, default=1, help="the other table's --attack-draw (default 1)")
    parser.add_argument("--first", type=Path, default=DRAW_0, help="the draw-0 table (default: the committed one)")
    parser.add_argument("--out", type=Path, default=DATA / "label-distribution-spread.csv", help="the joined rows")
    parser.add_argument("--summary", type=Path, default=DATA / "label-distribution-spread-summary.csv")
    args = parser.parse_args()
    if args.draw < 1:  # draw 0 is the first table: its columns would overwrite each other's
        parser.error(f"--draw must be >= 1 (draw 0 is --first), got {args.draw}")
    second = read(args.other)
    draws = {r.get("attack draw", "0") for r in second.values()}
    if draws != {str(args.draw)}:
        parser.error(f"{args.other} holds attack draw(s) {sorted(draws)}, not --draw {args.draw}")
    rows = joined(read(args.first), second, args.draw)
    write_csv(rows, args.out)
    write_csv(summary(rows, args.draw), args.summary)


if __name__ == "__main__":
    main()
