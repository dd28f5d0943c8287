"""The audit's report: one schema for every app — ``audit.json``, ``audit.md`` and ``grid.png``.

``audit.json`` holds the title, the model, the verdict, the metrics and budget settings, one entry per captured
update (``updates``: what was sent, the recipe read and where each value came from, the labels, each attack's
status and the strongest attack's scores), every attack's row (``rows``), their means (``summary``) and notes.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import numpy as np

from attacks.exchanges import NOTHING_ON_THE_WIRE
from attacks.frontier import mean_or_none, reid_cell
from attacks.metrics import match_batch
from attacks.observation import Observation, Reconstruction
from attacks.scoring import as_batch

TOP_LEVEL_KEYS = ("title", "model", "verdict", "metrics", "budget", "updates", "rows", "summary", "notes")


def verdict(updates: list[dict[str, Any]]) -> str:
    """One line: what the captures give away (labels, images), scored where the clients' images were known."""
    if not updates:
        return NOTHING_ON_THE_WIRE
    labels = [u for u in updates if u["labels"] is not None]
    scored = [u for u in updates if u.get("reid-top1") is not None]
    parts = [f"labels recovered for {len(labels)} of {len(updates)} update(s)"]
    exact = [u for u in labels if u.get("label-accuracy") is not None]
    if exact:
        parts[0] += f" ({sum(u['label-accuracy'] == 1.0 for u in exact)} of {len(exact)} exactly right)"
    if scored:
        top1 = float(np.mean([u["reid-top1"] for u in scored]))
        chance = float(np.mean([u["reid-chance"] for u in scored]))
        psnr = float(np.mean([u["psnr"] for u in scored]))
        parts.append(f"images re-identified {top1:.0%} top-1 (chance {chance:.0%}), matched PSNR {psnr:.1f} dB")
        leaks = bool(labels) or top1 > 2 * chance
    else:
        parts.append("images unscored (no ground truth and no --data)")
        leaks = bool(labels)
    return ("LEAKS: " if leaks else "no leak found: ") + "; ".join(parts)


def attack_label(row: dict[str, Any]) -> str:
    """The attack's name with its optimiser budget, where it has one."""
    return row["attack"] + (f" @ {row['budget']} steps" if row.get("budget") else "")


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean PSNR/SSIM, re-identification, label accuracy and time per (defence, setting, attack, budget), over
    the updates that could be attacked."""
    groups: dict[tuple[str, str, str, int | None], list[dict]] = {}
    for row in rows:
        groups.setdefault((row["defence"], row.get("setting", ""), row["attack"], row.get("budget")), []).append(row)
    out = []
    for (defence, setting, attack, budget), members in groups.items():
        scored = [m for m in members if m["psnr"] is not None]
        out.append(
            {
                "defence": defence,
                "setting": setting,
                "attack": attack,
                "budget": budget,
                "updates": len(members),
                "scored": len(scored),
                "psnr": float(np.mean([m["psnr"] for m in scored])) if scored else None,
                "ssim": float(np.mean([m["ssim"] for m in scored])) if scored else None,
                "reid-top1": mean_or_none([m.get("reid-top1") for m in members]),
                "reid-rank": mean_or_none([m.get("reid-rank") for m in members]),
                "reid-chance": mean_or_none([m.get("reid-chance") for m in members]),
                "seconds": float(np.mean([m["seconds"] for m in members])),
                "note": members[0]["note"],
                "label-accuracy": mean_or_none([m.get("label-accuracy") for m in members]),
            }
        )
    return out


def markdown(report: dict[str, Any]) -> str:
    """``audit.md``: the verdict, one line per update, then every attack's scores."""

    def fmt(v, spec):
        return "—" if v is None else format(v, spec)

    lines = [f"# {report['title']}", "", f"**Verdict:** {report['verdict']}", ""]
    lines += [f"Model: {report['model']}", "", f"Budget: {'; '.join(report['budget'])}", ""]
    lines += update_lines(report["updates"])
    lines += [
        "## Summary (mean over updates)",
        "",
        "Re-identification: top-1 rate of the true image among the decoy gallery (chance in brackets) and its mean "
        "rank; see the metrics line at the end.",
        "",
        "| defence | setting | attack | updates | matched PSNR (dB) | SSIM | re-identified (chance) | mean rank "
        "| label accuracy | seconds | note |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["summary"]:
        lines.append(
            f"| {r['defence']} | {r.get('setting', '')} | {attack_label(r)} | {r['updates']} | "
            f"{fmt(r['psnr'], '.1f')} | {fmt(r['ssim'], '.3f')} | {reid_cell(r)} | {fmt(r.get('reid-rank'), '.1f')} "
            f"| {fmt(r.get('label-accuracy'), '.0%')} | {r['seconds']:.3f} | {r['note']} |"
        )
    lines += [
        "",
        "## Every update",
        "",
        "| node | round | image | setting | defence | attack | matched | PSNR (dB) | SSIM | re-identified | mean rank "
        "| seconds |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["rows"]:
        lines.append(
            f"| {r.get('partition', '')} | {r.get('round', '')} | {r.get('image', '')} | {r.get('setting', '')} | "
            f"{r['defence']} | {attack_label(r)} | {r.get('matched') or ''} | {fmt(r['psnr'], '.1f')} | "
            f"{fmt(r['ssim'], '.3f')} | {fmt(r.get('reid-top1'), '.0%')} | {fmt(r.get('reid-rank'), '.1f')} | "
            f"{r['seconds']:.3f} |"
        )
    lines += ["", "Metrics: " + "; ".join(f"{k}: {v}" for k, v in report["metrics"].items()), ""]
    lines += [f"- {note}" for note in report["notes"]]
    return "\n".join(lines) + "\n"


def update_lines(updates: list[dict[str, Any]]) -> list[str]:
    """Per update: what was sent, the recipe read, the labels, the strongest attack's scores, each attack's status."""
    if not updates:
        return []

    def fmt(row: dict[str, Any], key: str, spec: str) -> str:
        return "unscored" if row.get(key) is None else format(row[key], spec)

    lines = ["## Updates", "", "| update | sent | B × steps | labels (recovered) | best attack | PSNR dB | SSIM "
             "| re-id top-1 | rank |", "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for u in updates:
        labels = "—" if u["labels"] is None else str(u["labels"])
        lines.append(
            f"| {u['update']} | {u['sent']} | {u['batch']} × {u['steps']} | {labels} | {u.get('best-attack') or '—'} "
            f"| {fmt(u, 'psnr', '.2f')} | {fmt(u, 'ssim', '.3f')} | {fmt(u, 'reid-top1', '.0%')} "
            f"| {fmt(u, 'reid-rank', '.1f')} |"
        )
    lines += ["", "### Attacks per update", ""]
    for u in updates:
        lines.append(f"- **{u['update']}**: recipe: {u['recipe']}")
        lines += [f"  - {name}: {status}" for name, status in u["attacks"].items()]
    return lines + [""]


GRID_IMAGES_PER_UPDATE = 4  # true images shown per update in grid.png (a batch can be larger)


def matched_images(rec: Reconstruction, truths: list[np.ndarray]) -> dict[int, np.ndarray]:
    """The reconstruction assigned to each true image (by index) in the one-to-one matching of :func:`score`."""
    images = rec.all_images
    if not images:
        return {}
    return {j: images[i] for i, j, _ in match_batch(images, truths)}


def save_grid(
    images: list[tuple[Observation, np.ndarray | None, dict[str, Reconstruction]]],
    path: Path,
    ranks: list[dict[str, list[float] | None]] | None = None,
) -> None:
    """One row per true image (up to four per update): original | each attack's reconstruction matched to it
    (blank where an attack could not run or left that image unmatched), with the true image's re-identification
    rank under it where ``ranks`` (per update: attack → per-true-image rank) has one."""
    from core.plots import plt

    if not images:
        return
    ranks = ranks or [{} for _ in images]
    names = list(dict.fromkeys(n for _, _, recs in images for n in recs))
    panels = []  # (row label, truth, {attack: image}, {attack: rank})
    for (obs, truth, recs), update_ranks in zip(images, ranks, strict=True):
        truths = as_batch(truth)
        if truths is None:
            panels.append((obs.meta.get("label", ""), None, {n: r.image for n, r in recs.items()}, {}))
            continue
        matched = {n: matched_images(r, truths) for n, r in recs.items()}
        for j, t in enumerate(truths[:GRID_IMAGES_PER_UPDATE]):
            label = obs.meta.get("label", "") + (f" #{j}" if len(truths) > 1 else "")
            ranked = {n: r[j] for n, r in update_ranks.items() if r is not None and matched[n].get(j) is not None}
            panels.append((label, t, {n: m.get(j) for n, m in matched.items()}, ranked))
    cols = 1 + len(names)
    fig, axes = plt.subplots(len(panels), cols, figsize=(1.6 * cols, 1.7 * len(panels)), squeeze=False)
    for i, (label, truth, recs, ranked) in enumerate(panels):
        for j, (name, img) in enumerate([("original", truth)] + [(n, recs.get(n)) for n in names]):
            ax = axes[i, j]
            ax.axis("off")
            if img is not None:
                ax.imshow(np.transpose(img, (1, 2, 0)))
            if name in ranked:
                ax.text(0.5, -0.04, f"re-id rank {ranked[name]:g}", transform=ax.transAxes, fontsize=5,
                        ha="center", va="top")  # fmt: skip
            if i == 0:
                ax.set_title(textwrap.fill(name, 24), fontsize=6)  # long attack names would overlap
        axes[i, 0].text(-0.1, 0.5, label, transform=axes[i, 0].transAxes, fontsize=6, ha="right", va="center")
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
