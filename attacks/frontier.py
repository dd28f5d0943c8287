"""The leakage-vs-utility frontier: per defence and setting, what the strongest attack recovers (matched PSNR,
label accuracy) against what the defence costs in accuracy.

Rows come from an audit's table: every (defence, setting, attack) with its matched PSNR/SSIM, the
no-information baseline of the same updates, the label-recovery accuracy, and the accuracy cost (final accuracy
of a plain run minus the defence's, from short training runs; None where not measured).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from core.results import atomic_write

PLAIN = "plain"  # the defence whose accuracy the others are compared with
LABELS = "labels (head-bias gradient)"
BASELINE_PREFIX = "best flat image"


def mean_or_none(values: list[float | None]) -> float | None:
    """The mean of the values that are not None (None when there are none)."""
    values = [v for v in values if v is not None]
    return float(np.mean(values)) if values else None


def frontier_rows(audit_rows: list[dict[str, Any]], accuracy: dict[str, float]) -> list[dict[str, Any]]:
    """One row per (defence, setting, attack) that produced images, means over the updates of that case."""
    cases: dict[tuple[str, str], list[dict]] = {}
    for row in audit_rows:
        defence = row.get("defence-name") or row["defence"]
        cases.setdefault((defence, row.get("setting", "")), []).append(row)
    plain_accuracy = accuracy.get(PLAIN)
    out = []
    for (defence, setting), rows in cases.items():
        baseline = mean_or_none([r["psnr"] for r in rows if r["attack"].startswith(BASELINE_PREFIX)])
        labels = mean_or_none([r.get("label-accuracy") for r in rows if r["attack"] == LABELS])
        cost = None
        if defence in accuracy and plain_accuracy is not None:
            cost = plain_accuracy - accuracy[defence]
        attacks = dict.fromkeys(r["attack"] for r in rows if "reference" not in r["attack"] and r["attack"] != LABELS)
        for attack in attacks:
            scored = [r for r in rows if r["attack"] == attack]
            out.append(
                {
                    "defence": defence,
                    "setting": setting,
                    "batch-size": scored[0].get("batch-size"),
                    "local-steps": scored[0].get("local-steps"),
                    "attack": attack,
                    "updates": len(scored),
                    "psnr": mean_or_none([r["psnr"] for r in scored]),
                    "ssim": mean_or_none([r["ssim"] for r in scored]),
                    "baseline-psnr": baseline,
                    "label-accuracy": labels,
                    "accuracy": accuracy.get(defence),
                    "accuracy-cost": cost,
                    "seconds": mean_or_none([r["seconds"] for r in scored]),
                    "note": "" if mean_or_none([r["psnr"] for r in scored]) is not None else scored[0]["note"],
                }
            )
    return out


def best_attacks(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (defence, setting): the attack with the highest matched PSNR (the frontier's point)."""
    best: dict[tuple[str, str], dict] = {}
    for row in rows:
        key = (row["defence"], row["setting"])
        if row["psnr"] is not None and (key not in best or row["psnr"] > best[key]["psnr"]):
            best[key] = row
    return list(best.values())


def _fmt(value: float | None, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def markdown(rows: list[dict[str, Any]], skipped: list[str]) -> str:
    lines = [
        "# Leakage vs utility frontier",
        "",
        "Best attack per defence and setting (matched PSNR: reconstructions assigned one to one to the true images; "
        "baseline: the best flat image, which needs no information; accuracy cost: plain minus defence, final "
        "accuracy of short training runs).",
        "",
        "| defence | setting | best attack | matched PSNR (dB) | SSIM | baseline PSNR (dB) | gain over baseline (dB) "
        "| label accuracy | accuracy cost (pp) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in best_attacks(rows):
        gain = None if r["baseline-psnr"] is None else r["psnr"] - r["baseline-psnr"]
        cost = None if r["accuracy-cost"] is None else 100 * r["accuracy-cost"]
        lines.append(
            f"| {r['defence']} | {r['setting']} | {r['attack']} | {r['psnr']:.1f} | {_fmt(r['ssim'], '.3f')} | "
            f"{_fmt(r['baseline-psnr'], '.1f')} | {_fmt(gain, '+.1f')} | {_fmt(r['label-accuracy'], '.0%')} | "
            f"{_fmt(cost, '+.1f')} |"
        )
    lines += ["", "## Every attack", "", "| defence | setting | attack | matched PSNR (dB) | SSIM | seconds | note |",
              "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        lines.append(
            f"| {r['defence']} | {r['setting']} | {r['attack']} | {_fmt(r['psnr'], '.1f')} | {_fmt(r['ssim'], '.3f')} "
            f"| {_fmt(r['seconds'], '.1f')} | {r['note']} |"
        )
    if skipped:
        lines += ["", "Not run: " + "; ".join(skipped)]
    return "\n".join(lines) + "\n"


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """One panel per setting: the best attack's matched PSNR per defence against its accuracy cost (defences
    without a measured cost are drawn at cost 0 with a hollow marker); the dashed line is the baseline."""
    from core.plots import plt

    best = best_attacks(rows)
    settings = list(dict.fromkeys(r["setting"] for r in best))
    if not settings:
        return
    fig, axes = plt.subplots(1, len(settings), figsize=(4.2 * len(settings), 3.6), squeeze=False)
    for ax, setting in zip(axes[0], settings, strict=True):
        points = [r for r in best if r["setting"] == setting]
        for r in points:
            measured = r["accuracy-cost"] is not None
            x = 100 * r["accuracy-cost"] if measured else 0.0
            ax.scatter([x], [r["psnr"]], facecolors=None if measured else "none", edgecolors="C0", s=22)
            ax.annotate(r["defence"], (x, r["psnr"]), fontsize=5, xytext=(3, 2), textcoords="offset points")
        baselines = [r["baseline-psnr"] for r in points if r["baseline-psnr"] is not None]
        if baselines:
            ax.axhline(float(np.mean(baselines)), ls="--", color="grey", lw=0.8, label="no-information baseline")
            ax.legend(fontsize=6, loc="upper right")
        ax.set_title(setting, fontsize=8)
        ax.set_xlabel("accuracy cost (pp, plain − defence)", fontsize=7)
        ax.set_ylabel("best attack, matched PSNR (dB)", fontsize=7)
        ax.tick_params(labelsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=140)
    plt.close(fig)


def final_accuracies(folder: Path) -> dict[str, float]:
    """Final accuracy per method of a finished ``fedvit experiment`` (its ``summary.json``), for the accuracy-cost
    axis; the methods must be named as ``--defences`` spells the defences (``conf/experiments/frontier-cpu.toml``)."""
    summary = folder / "summary.json"
    if not summary.is_file():
        raise ValueError(f"--accuracy-from {folder}: no summary.json (run `fedvit experiment` to completion first)")
    return {row["method"]: float(row["final"]) for row in json.loads(summary.read_text())}


def write_frontier(
    audit_rows: list[dict[str, Any]], out: Path, accuracy: dict[str, float], skipped: list[str] | None = None
) -> list[dict[str, Any]]:
    """Write ``frontier.json``, ``frontier.md`` and ``frontier.png`` under ``out``; returns the rows."""
    rows = frontier_rows(audit_rows, accuracy)
    report = {"rows": rows, "best": best_attacks(rows), "accuracy": accuracy, "skipped": skipped or []}
    atomic_write(out / "frontier.json", json.dumps(report, indent=1, default=float).encode())
    atomic_write(out / "frontier.md", markdown(rows, skipped or []).encode())
    plot(rows, out / "frontier.png")
    return rows


def main(argv: list[str] | None = None) -> int:
    """Rewrite an audit's frontier from its ``audit.json`` (e.g. with accuracies that arrived later)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m attacks.frontier", description=main.__doc__)
    parser.add_argument("audit", type=Path, help="a folder with audit.json (fedvit audit --benchmark or <run>)")
    parser.add_argument("--accuracy-from", type=Path, help="a finished `fedvit experiment` folder")
    args = parser.parse_args(argv)
    try:
        rows = json.loads((args.audit / "audit.json").read_text())["rows"]
        accuracy = final_accuracies(args.accuracy_from) if args.accuracy_from else {}
    except (OSError, ValueError, KeyError) as err:
        print(f"frontier: {err}")
        return 2
    write_frontier(rows, args.audit, accuracy)
    print((args.audit / "frontier.md").read_text().split("\n## Every attack")[0])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
