"""The leakage-vs-utility frontier: per defence and setting, what the strongest attack recovers (matched PSNR,
label accuracy) against what the defence costs in accuracy.

Rows come from an audit's table: every (defence, setting, attack) with its matched PSNR/SSIM, the
no-information baseline of the same updates, the label-recovery accuracy, and the accuracy cost (final accuracy
of a plain run minus the defence's, from short training runs; None where not measured).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np

from fedvit.audit.evidence import IMAGE_MARGIN, LABELS, REID_SIGNIFICANCE, images_clear
from fedvit.audit.json_fields import as_json
from fedvit.core.results import atomic_write

PLAIN = "plain"  # the defence whose accuracy the others are compared with
BASELINE_PREFIX = "best flat image"


def mean_or_none(values: list[float | None]) -> float | None:
    """The mean of the values that are not None (None when there are none)."""
    values = [v for v in values if v is not None]
    return float(np.mean(values)) if values else None


@dataclasses.dataclass(frozen=True)
class FrontierRow:
    """One (defence, setting, attack, budget) of an audit: its means over the updates of that case
    (:func:`frontier_rows`)."""

    defence: str
    setting: str
    attack: str
    batch_size: int | None = None
    local_steps: int | None = None
    budget: int | None = None  # Adam steps per restart (None: a closed form)
    steps_done: float | None = None
    steps_asked: float | None = None
    updates: int = 0
    psnr: float | None = None
    ssim: float | None = None
    reid_top1: float | None = None
    reid_rank: float | None = None
    reid_chance: float | None = None
    reid_null: float | None = None
    reid_images: int = 0  # the true images re-identified over
    baseline_psnr: float | None = None  # the best flat image's: no information
    label_accuracy: float | None = None
    accuracy: float | None = None
    accuracy_cost: float | None = None  # plain minus this defence's final accuracy
    seconds: float | None = None
    note: str = ""


@dataclasses.dataclass(frozen=True)
class Recognised:
    """The attack whose reconstructions are re-identified most at a budget."""

    attack: str
    reid_top1: float
    reid_rank: float
    reid_chance: float


@dataclasses.dataclass(frozen=True, kw_only=True)
class BestAttack(FrontierRow):
    """The frontier's point at one budget: the best-PSNR attack, the case's verdict there (:func:`budget_word`)
    and the attack re-identified most."""

    budget_level: int | None
    verdict: str
    most_recognisable: Recognised | None


MEANS = ("steps-done", "steps-asked", "psnr", "ssim", "reid-top1", "reid-rank", "reid-chance", "reid-null", "seconds")


def frontier_rows(audit_rows: list[dict[str, Any]], accuracy: dict[str, float]) -> list[FrontierRow]:
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
            mean = {key: mean_or_none([r.get(key) for r in scored]) for key in MEANS}
            out.append(FrontierRow(
                defence, setting, attack, scored[0].get("batch-size"), scored[0].get("local-steps"), budget,
                mean["steps-done"], mean["steps-asked"], len(scored), mean["psnr"], mean["ssim"], mean["reid-top1"],
                mean["reid-rank"], mean["reid-chance"], mean["reid-null"], len(ranks), baseline, labels,
                accuracy.get(defence), cost, mean["seconds"], "" if mean["psnr"] is not None else scored[0]["note"],
            ))  # fmt: skip
    return out


RISING_DB = 0.5  # a gain this large from the previous budget means the attack had not converged


def leaks(row: FrontierRow) -> bool:
    """Whether the row's images leak: :func:`fedvit.audit.evidence.images_clear`, the report's rule, over the case's
    true images (matched PSNR is a figure beside it: a flat image of the right colours gains dB without revealing
    any image)."""
    if row.reid_top1 is None or not row.reid_images:
        return False
    return images_clear(row.reid_top1, row.reid_null, row.reid_chance, row.reid_images)


def _levels(rows: list[FrontierRow]) -> list[int | None]:
    """The optimiser budgets of a case, ascending ([None] when no attack of it has one)."""
    budgets = sorted({r.budget for r in rows if r.budget is not None})
    return budgets or [None]


def best_attacks(rows: list[FrontierRow]) -> list[BestAttack]:
    """Per (defence, setting, budget): the attack with the highest matched PSNR (the frontier's point; attacks
    without a budget, the closed forms, compete at every budget), with the case's verdict at that budget."""
    cases: dict[tuple[str, str], list[FrontierRow]] = {}
    for row in rows:
        cases.setdefault((row.defence, row.setting), []).append(row)
    out = []
    for case in cases.values():
        previous = None
        for level in _levels(case):
            pool = [r for r in case if r.budget in (level, None) and r.psnr is not None]
            if not pool:
                continue
            best = max(pool, key=lambda r: r.psnr)
            budgeted = [r for r in pool if r.budget is not None]
            ranked = [r for r in pool if r.reid_top1 is not None]
            most = max(ranked, key=lambda r: (r.reid_top1, -r.reid_rank)) if ranked else None
            recognisable = None if most is None else Recognised(most.attack, most.reid_top1, most.reid_rank,
                                                                most.reid_chance)  # fmt: skip
            out.append(BestAttack(**dataclasses.asdict(best), budget_level=level,
                                  verdict=budget_word(pool, budgeted, previous), most_recognisable=recognisable))
            previous = budgeted
    return out


def budget_word(pool: list[FrontierRow], budgeted: list[FrontierRow], previous: list[FrontierRow] | None) -> str:
    """'leaks' when any attack leaks; else 'at baseline', or 'budget-limited' when the optimisation attack ran
    into its time cap or still gained ≥ RISING_DB dB (or re-identifications) over the previous budget."""
    if any(leaks(r) for r in pool):
        return "leaks"
    if all(r.reid_top1 is None for r in pool):
        return "not judged (no re-identification: no ground truth or no decoys)"
    capped = [r for r in budgeted if None not in (r.steps_done, r.steps_asked) and r.steps_done < r.steps_asked]
    if capped:
        r = capped[0]
        return f"budget-limited (time cap: {r.steps_done:.0f} of {r.steps_asked:.0f} steps)"
    if budgeted and previous:
        now = max(budgeted, key=lambda r: r.psnr)
        before = max(previous, key=lambda r: r.psnr)
        gain = now.psnr - before.psnr
        more_reid = (now.reid_top1 or 0) > (before.reid_top1 or 0)
        if gain >= RISING_DB or more_reid:
            return f"budget-limited (still rising: {gain:+.1f} dB from {before.budget} to {now.budget} steps)"
    return "at baseline"


def fmt(value: float | None, spec: str) -> str:
    """A number for a report table, "—" where there is none."""
    return "—" if value is None else format(value, spec)


def reid_cell(row: FrontierRow | Recognised) -> str:
    """'top-1 rate (chance)' of a row, or '—' where re-identification was not scored."""
    if row.reid_top1 is None:
        return "—"
    return f"{row.reid_top1:.0%} ({row.reid_chance:.0%})"


def _reid(row: FrontierRow | Recognised) -> str:
    cell = reid_cell(row)
    return cell if row.reid_top1 is None else f"{cell} / {row.reid_rank:.1f}"


def _most_recognisable(row: BestAttack) -> str:
    """The best row's re-identification, or the attack whose reconstructions are re-identified most (named)."""
    most = row.most_recognisable
    if most is None or most.attack == row.attack:
        return _reid(row)
    return f"{_reid(most)} ({most.attack})"


def markdown(rows: list[FrontierRow], skipped: list[str]) -> str:
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
        gain = None if r.baseline_psnr is None else r.psnr - r.baseline_psnr
        cost = None if r.accuracy_cost is None else 100 * r.accuracy_cost
        lines.append(
            f"| {r.defence} | {r.setting} | {r.budget_level or '—'} | {r.attack} | {r.psnr:.1f} | "
            f"{fmt(r.ssim, '.3f')} | {fmt(r.baseline_psnr, '.1f')} | {fmt(gain, '+.1f')} | "
            f"{_most_recognisable(r)} | {r.verdict} | {fmt(r.label_accuracy, '.0%')} | {fmt(cost, '+.1f')} |"
        )
    lines += ["", "## Every attack", "",
              "| defence | setting | attack | budget (steps) | matched PSNR (dB) | SSIM | re-identified (chance) / "
              "mean rank | seconds | note |",
              "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        lines.append(
            f"| {r.defence} | {r.setting} | {r.attack} | {r.budget or '—'} | {fmt(r.psnr, '.1f')} "
            f"| {fmt(r.ssim, '.3f')} | {_reid(r)} | {fmt(r.seconds, '.1f')} | {r.note} |"
        )
    if skipped:
        lines += ["", "Not run: " + "; ".join(skipped)]
    return "\n".join(lines) + "\n"


def plot(rows: list[FrontierRow], path: Path) -> None:
    """One panel per setting: the best attack's matched PSNR per defence (at the largest budget) against its
    accuracy cost (defences without a measured cost at cost 0, hollow); the dashed line is the baseline. Where
    several budgets ran, two more panels: the best optimisation attack's PSNR and re-identification vs budget."""
    from fedvit.core.plots import plt

    best = best_attacks(rows)
    settings = list(dict.fromkeys(r.setting for r in best))
    if not settings:
        return
    budgets = sorted({r.budget for r in rows if r.budget is not None})
    panels = len(settings) + (2 if len(budgets) > 1 else 0)
    fig, axes = plt.subplots(1, panels, figsize=(4.2 * panels, 3.6), squeeze=False)
    for ax, setting in zip(axes[0], settings, strict=False):
        points = [r for r in best if r.setting == setting]
        top = {r.defence: r for r in points}  # the largest budget's point per defence (levels ascend)
        for r in top.values():
            measured = r.accuracy_cost is not None
            x = 100 * r.accuracy_cost if measured else 0.0
            ax.scatter([x], [r.psnr], facecolors=None if measured else "none", edgecolors="C0", s=22)
            ax.annotate(r.defence, (x, r.psnr), fontsize=5, xytext=(3, 2), textcoords="offset points")
        baselines = [r.baseline_psnr for r in top.values() if r.baseline_psnr is not None]
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


def _budget_panels(rows: list[FrontierRow], budgets: list[int], psnr_ax, reid_ax) -> None:
    """Per (defence, setting): the best budgeted attack's PSNR (solid; its baseline dotted) and re-identification
    rate (chance dotted) against the budget."""
    cases = dict.fromkeys((r.defence, r.setting) for r in rows if r.budget is not None)
    for i, (defence, setting) in enumerate(cases):
        per = [[r for r in rows if (r.defence, r.setting, r.budget) == (defence, setting, b) and r.psnr is not None]
               for b in budgets]  # fmt: skip
        xs = [b for b, rs in zip(budgets, per, strict=True) if rs]
        tops = [max(rs, key=lambda r: r.psnr) for rs in per if rs]
        if not tops:
            continue
        label, colour = f"{defence}, {setting}", f"C{i % 10}"
        psnr_ax.plot(xs, [r.psnr for r in tops], marker="o", ms=3, color=colour, label=label)
        if tops[0].baseline_psnr is not None:
            psnr_ax.axhline(tops[0].baseline_psnr, ls=":", lw=0.7, color=colour)
        if tops[0].reid_top1 is not None:
            reid_ax.plot(xs, [100 * r.reid_top1 for r in tops], marker="o", ms=3, color=colour, label=label)
            reid_ax.axhline(100 * tops[0].reid_chance, ls=":", lw=0.7, color=colour)
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
) -> list[FrontierRow]:
    """Write ``frontier.json``, ``frontier.md`` and ``frontier.png`` under ``out``; returns the rows."""
    rows = frontier_rows(audit_rows, accuracy)
    report = {"rows": rows, "best": best_attacks(rows), "accuracy": accuracy, "skipped": skipped or []}
    atomic_write(out / "frontier.json", json.dumps(as_json(report), indent=1, default=float).encode())
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
