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

from fedvit.audit.evidence import IMAGE_MARGIN, LABELS, REID_SIGNIFICANCE, images_clear
from fedvit.core.results import atomic_write

PLAIN = "plain"  # the defence whose accuracy the others are compared with
BASELINE_PREFIX = "best flat image"


def mean_or_none(values: list[float | None]) -> float | None:
    """The mean of the values that are not None (None when there are none)."""
    values = [v for v in values if v is not None]
    return float(np.mean(values)) if values else None


def frontier_rows(audit_rows: list[dict[str, Any]], accuracy: dict[str, float]) -> list[dict[str, Any]]:
    """One row per (defence, setting, attack, budget) that produced images, means over the updates of that case."""
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
        attacks = dict.fromkeys(
            (r["attack"], r.get("budget")) for r in rows if "reference" not in r["attack"] and r["attack"] != LABELS
        )
        for attack, budget in attacks:
            scored = [r for r in rows if r["attack"] == attack and r.get("budget") == budget]
            ranks = [rank for r in scored for rank in (r.get("reid-ranks") or [])]
            out.append(
                {
                    "defence": defence,
                    "setting": setting,
                    "batch-size": scored[0].get("batch-size"),
                    "local-steps": scored[0].get("local-steps"),
                    "attack": attack,
                    "budget": budget,
                    "steps-done": mean_or_none([r.get("steps-done") for r in scored]),
                    "steps-asked": mean_or_none([r.get("steps-asked") for r in scored]),
                    "updates": len(scored),
                    "psnr": mean_or_none([r["psnr"] for r in scored]),
                    "ssim": mean_or_none([r["ssim"] for r in scored]),
                    "reid-top1": mean_or_none([r.get("reid-top1") for r in scored]),
                    "reid-rank": mean_or_none([r.get("reid-rank") for r in scored]),
                    "reid-chance": mean_or_none([r.get("reid-chance") for r in scored]),
                    "reid-null": mean_or_none([r.get("reid-null") for r in scored]),
                    "reid-images": len(ranks),
                    "baseline-psnr": baseline,
                    "label-accuracy": labels,
                    "accuracy": accuracy.get(defence),
                    "accuracy-cost": cost,
                    "seconds": mean_or_none([r["seconds"] for r in scored]),
                    "note": "" if mean_or_none([r["psnr"] for r in scored]) is not None else scored[0]["note"],
                }
            )
    return out


RISING_DB = 0.5  # a gain this large from the previous budget means the attack had not converged


def leaks(row: dict[str, Any]) -> bool:
    """Whether the row's images leak: :func:`fedvit.audit.evidence.images_clear`, the report's rule, over the case's
    true images (matched PSNR is a figure beside it: a flat image of the right colours gains dB without revealing
    any image)."""
    if row.get("reid-top1") is None or not row.get("reid-images"):
        return False
    return images_clear(row["reid-top1"], row.get("reid-null"), row.get("reid-chance"), int(row["reid-images"]))


def _levels(rows: list[dict[str, Any]]) -> list[int | None]:
    """The optimiser budgets of a case, ascending ([None] when no attack of it has one)."""
    budgets = sorted({r["budget"] for r in rows if r.get("budget") is not None})
    return budgets or [None]


def best_attacks(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (defence, setting, budget): the attack with the highest matched PSNR (the frontier's point; attacks
    without a budget, the closed forms, compete at every budget), with the case's verdict at that budget."""
    cases: dict[tuple[str, str], list[dict]] = {}
    for row in rows:
        cases.setdefault((row["defence"], row["setting"]), []).append(row)
    out = []
    for case in cases.values():
        previous = None
        for level in _levels(case):
            pool = [r for r in case if r.get("budget") in (level, None) and r["psnr"] is not None]
            if not pool:
                continue
            best = max(pool, key=lambda r: r["psnr"])
            budgeted = [r for r in pool if r.get("budget") is not None]
            ranked = [r for r in pool if r.get("reid-top1") is not None]
            most = max(ranked, key=lambda r: (r["reid-top1"], -r["reid-rank"])) if ranked else None
            keys = ("attack", "reid-top1", "reid-rank", "reid-chance")
            recognisable = None if most is None else {k: most[k] for k in keys}
            row = dict(best, **{"budget-level": level, "verdict": budget_word(pool, budgeted, previous),
                                "most-recognisable": recognisable})  # fmt: skip
            out.append(row)
            previous = budgeted
    return out


def budget_word(pool: list[dict], budgeted: list[dict], previous: list[dict] | None) -> str:
    """'leaks' when any attack leaks; else 'at baseline', or 'budget-limited' when the optimisation attack ran
    into its time cap or still gained ≥ RISING_DB dB (or re-identifications) over the previous budget."""
    if any(leaks(r) for r in pool):
        return "leaks"
    if all(r.get("reid-top1") is None for r in pool):
        return "not judged (no re-identification: no ground truth or no decoys)"
    capped = [r for r in budgeted if None not in (r.get("steps-done"), r.get("steps-asked"))
              and r["steps-done"] < r["steps-asked"]]  # fmt: skip
    if capped:
        r = capped[0]
        return f"budget-limited (time cap: {r['steps-done']:.0f} of {r['steps-asked']:.0f} steps)"
    if budgeted and previous:
        now = max(budgeted, key=lambda r: r["psnr"])
        before = max(previous, key=lambda r: r["psnr"])
        gain = now["psnr"] - before["psnr"]
        more_reid = (now.get("reid-top1") or 0) > (before.get("reid-top1") or 0)
        if gain >= RISING_DB or more_reid:
            return f"budget-limited (still rising: {gain:+.1f} dB from {before['budget']} to {now['budget']} steps)"
    return "at baseline"


def fmt(value: float | None, spec: str) -> str:
    """A number for a report table, "—" where there is none."""
    return "—" if value is None else format(value, spec)


def reid_cell(row: dict[str, Any]) -> str:
    """'top-1 rate (chance)' of a row, or '—' where re-identification was not scored."""
    if row.get("reid-top1") is None:
        return "—"
    return f"{row['reid-top1']:.0%} ({row['reid-chance']:.0%})"


def _reid(row: dict[str, Any]) -> str:
    cell = reid_cell(row)
    return cell if row.get("reid-top1") is None else f"{cell} / {row['reid-rank']:.1f}"


def _most_recognisable(row: dict[str, Any]) -> str:
    """The best row's re-identification, or the attack whose reconstructions are re-identified most (named)."""
    most = row.get("most-recognisable")
    if most is None or most["attack"] == row["attack"]:
        return _reid(row)
    return f"{_reid(most)} ({most['attack']})"


def markdown(rows: list[dict[str, Any]], skipped: list[str]) -> str:
    lines = [
        "# Leakage vs utility frontier",
        "",
        "Best attack per defence, setting and optimiser budget (matched PSNR: reconstructions assigned one to one to "
        "the true images; baseline: the best flat image, which needs no information; re-identified: top-1 rate of "
        "the true image among a gallery of decoys, chance in brackets, then its mean rank, for the attack whose "
        "reconstructions are re-identified most (named when it is not the best-PSNR attack); budget: Adam steps per "
        "restart of the optimisation attacks, closed forms compete at every budget; verdict: 'leaks' when any "
        f"attack re-identifies ≥ {IMAGE_MARGIN:.0%} above the larger of chance and its null (the same protocol on "
        f"images the update never saw) at binomial p < {REID_SIGNIFICANCE:g}, the report's rule; 'not judged' "
        "without re-identification; 'budget-limited' when it does not leak but the optimisation attack was still "
        "rising "
        f"(≥ {RISING_DB:g} dB or more re-identifications than at the previous budget) or hit its time cap; accuracy "
        "cost: plain minus defence, final accuracy of short training runs).",
        "",
        "| defence | setting | budget (steps) | best attack | matched PSNR (dB) | SSIM | baseline PSNR (dB) | gain "
        "over baseline (dB) | most re-identified (chance) / mean rank | verdict | label accuracy | accuracy cost "
        "(pp) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in best_attacks(rows):
        gain = None if r["baseline-psnr"] is None else r["psnr"] - r["baseline-psnr"]
        cost = None if r["accuracy-cost"] is None else 100 * r["accuracy-cost"]
        lines.append(
            f"| {r['defence']} | {r['setting']} | {r['budget-level'] or '—'} | {r['attack']} | {r['psnr']:.1f} | "
            f"{fmt(r['ssim'], '.3f')} | {fmt(r['baseline-psnr'], '.1f')} | {fmt(gain, '+.1f')} | "
            f"{_most_recognisable(r)} | "
            f"{r['verdict']} | {fmt(r['label-accuracy'], '.0%')} | {fmt(cost, '+.1f')} |"
        )
    lines += ["", "## Every attack", "",
              "| defence | setting | attack | budget (steps) | matched PSNR (dB) | SSIM | re-identified (chance) / "
              "mean rank | seconds | note |",
              "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        lines.append(
            f"| {r['defence']} | {r['setting']} | {r['attack']} | {r.get('budget') or '—'} | {fmt(r['psnr'], '.1f')} "
            f"| {fmt(r['ssim'], '.3f')} | {_reid(r)} | {fmt(r['seconds'], '.1f')} | {r['note']} |"
        )
    if skipped:
        lines += ["", "Not run: " + "; ".join(skipped)]
    return "\n".join(lines) + "\n"


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """One panel per setting: the best attack's matched PSNR per defence (at the largest budget) against its
    accuracy cost (defences without a measured cost at cost 0, hollow); the dashed line is the baseline. Where
    several budgets ran, two more panels: the best optimisation attack's PSNR and re-identification vs budget."""
    from fedvit.core.plots import plt

    best = best_attacks(rows)
    settings = list(dict.fromkeys(r["setting"] for r in best))
    if not settings:
        return
    budgets = sorted({r["budget"] for r in rows if r.get("budget") is not None})
    panels = len(settings) + (2 if len(budgets) > 1 else 0)
    fig, axes = plt.subplots(1, panels, figsize=(4.2 * panels, 3.6), squeeze=False)
    for ax, setting in zip(axes[0], settings, strict=False):
        points = [r for r in best if r["setting"] == setting]
        top = {r["defence"]: r for r in points}  # the largest budget's point per defence (levels ascend)
        for r in top.values():
            measured = r["accuracy-cost"] is not None
            x = 100 * r["accuracy-cost"] if measured else 0.0
            ax.scatter([x], [r["psnr"]], facecolors=None if measured else "none", edgecolors="C0", s=22)
            ax.annotate(r["defence"], (x, r["psnr"]), fontsize=5, xytext=(3, 2), textcoords="offset points")
        baselines = [r["baseline-psnr"] for r in top.values() if r["baseline-psnr"] is not None]
        if baselines:
            ax.axhline(float(np.mean(baselines)), ls="--", color="grey", lw=0.8, label="no-information baseline")
            ax.legend(fontsize=6, loc="upper right")
        ax.set_title(setting, fontsize=8)
        ax.set_xlabel("accuracy cost (pp, plain − defence)", fontsize=7)
        ax.set_ylabel("best attack, matched PSNR (dB)", fontsize=7)
        ax.tick_params(labelsize=6)
    if len(budgets) > 1:
        _budget_panels(rows, budgets, axes[0][len(settings)], axes[0][len(settings) + 1])
    fig.tight_layout()
    fig.savefig(path, dpi=140)
    plt.close(fig)


def _budget_panels(rows: list[dict[str, Any]], budgets: list[int], psnr_ax, reid_ax) -> None:
    """Per (defence, setting): the best budgeted attack's PSNR (solid; its baseline dotted) and re-identification
    rate (chance dotted) against the budget."""
    cases = dict.fromkeys((r["defence"], r["setting"]) for r in rows if r.get("budget") is not None)
    for i, (defence, setting) in enumerate(cases):
        per = [[r for r in rows if (r["defence"], r["setting"], r.get("budget")) == (defence, setting, b)
                and r["psnr"] is not None] for b in budgets]  # fmt: skip
        xs = [b for b, rs in zip(budgets, per, strict=True) if rs]
        tops = [max(rs, key=lambda r: r["psnr"]) for rs in per if rs]
        if not tops:
            continue
        label, colour = f"{defence}, {setting}", f"C{i % 10}"
        psnr_ax.plot(xs, [r["psnr"] for r in tops], marker="o", ms=3, color=colour, label=label)
        if tops[0]["baseline-psnr"] is not None:
            psnr_ax.axhline(tops[0]["baseline-psnr"], ls=":", lw=0.7, color=colour)
        if tops[0].get("reid-top1") is not None:
            reid_ax.plot(xs, [100 * r["reid-top1"] for r in tops], marker="o", ms=3, color=colour, label=label)
            reid_ax.axhline(100 * tops[0]["reid-chance"], ls=":", lw=0.7, color=colour)
    axes = ((psnr_ax, "matched PSNR (dB); dotted: baseline"), (reid_ax, "re-identified (%); dotted: chance"))
    for ax, ylabel in axes:
        ax.set_xscale("log")
        ax.set_xlabel("optimiser budget (Adam steps per restart)", fontsize=7)
        ax.set_ylabel(ylabel, fontsize=7)
        ax.tick_params(labelsize=6)
        if ax.lines:
            ax.legend(fontsize=5)
    psnr_ax.set_title("leakage vs attacker budget", fontsize=8)


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

    parser = argparse.ArgumentParser(prog="python -m fedvit.audit.frontier", description=main.__doc__)
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
