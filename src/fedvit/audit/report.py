"""The audit's report, one schema for every app: ``audit.json`` (:data:`TOP_LEVEL_KEYS`; per update what was sent,
the recipe and its sources, labels, each attack's status and the best scores), ``audit.md`` and ``grid.png``."""

from __future__ import annotations

import dataclasses
import json
import textwrap
from pathlib import Path
from typing import Any

import numpy as np

from fedvit.audit.entries import ClientRounds, UpdateAudit
from fedvit.audit.evidence import (
    MEASURED,
    Evidence,
    ImageEvidence,
    LabelEvidence,
    PowerEvidence,
    PrivacyEvidence,
    needed_text,
    null_text,
    threshold_text,
)
from fedvit.audit.frontier import FrontierRow, fmt, reid_cell
from fedvit.audit.json_fields import json_keys
from fedvit.audit.membership_stats import Judgement
from fedvit.audit.metrics import ImageScores, as_batch, match_batch
from fedvit.audit.secagg import SecureAggregation, gap_text
from fedvit.audit.summary import ClientFinding, summary_table
from fedvit.observed.observation import Observation, Reconstruction

NOT_APPLICABLE = "not applicable: "


@dataclasses.dataclass(frozen=True)
class AuditReport:
    """What an audit found: ``audit.json`` holds its fields in this order (:func:`as_json`, :data:`TOP_LEVEL_KEYS`),
    ``audit.md`` reads them (:func:`markdown`)."""

    title: str
    model: str
    read_from_app: list[dict[str, str]]  # fedvit audit-app's facts (what, value, source, side)
    threat_model: str
    verdict: str  # at most three lines (:func:`fedvit.audit.summary.short_verdict`)
    findings: list[ClientFinding]
    together: dict[str, str]  # leakage type → what the clients together show (:func:`~.summary.jointly_leaking`)
    verdict_detail: str
    metrics: dict[str, str]  # how the figures were scored
    budget: list[str]
    updates: list[UpdateAudit]
    clients: list[ClientRounds]
    rows: list[dict[str, Any]]  # every attack's row per update (the frontier's input)
    summary: list[FrontierRow]  # each attack's means per defence and setting (:func:`~.frontier.frontier_rows`)
    notes: list[str]
    secure_aggregation: SecureAggregation | None


TOP_LEVEL_KEYS = json_keys(AuditReport)  # audit.json's, in order


def json_text(report: dict[str, Any]) -> str:
    """``audit.json``'s text of a report :func:`as_json` gave (anything JSON has no type for: its text)."""
    return json.dumps(report, indent=1, default=str)


def markdown(report: AuditReport) -> str:
    """``audit.md``: the verdict (≤ 3 lines) and one row per client first, then the detail: per update what was sent,
    the recipe and the evidence, the attacks that did not apply once per reason, each attack's means."""
    lines = [f"# {report.title}", "", "**Verdict**", ""]
    lines += [f"> {line}  " for line in report.verdict.splitlines()] + [""]
    lines += summary_lines(report.findings)
    lines += secure_lines(report.secure_aggregation)
    lines += ["## Detail", "", f"In full: {report.verdict_detail}", "", f"Threat model: {report.threat_model}", ""]
    lines += [f"Model: {report.model}", ""]
    lines += app_fact_lines(report.read_from_app)
    lines += [f"Budget: {'; '.join(report.budget)}", ""]
    lines += update_lines(report.updates)
    lines += client_lines(report.clients)
    lines += [
        "## Attacks (mean over updates)",
        "",
        "| defence | setting | attack | budget (steps) | updates | matched PSNR (dB) | SSIM | reference PSNR (dB) "
        "| re-identified (chance) | mean rank | label accuracy | seconds | note |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report.summary:
        lines.append(
            f"| {r.defence} | {r.setting} | {r.attack} | {r.budget or '—'} | {r.updates} | "
            f"{fmt(r.psnr, '.1f')} | {fmt(r.ssim, '.3f')} | {fmt(r.baseline_psnr, '.1f')} | {reid_cell(r)} "
            f"| {fmt(r.reid_rank, '.1f')} | {fmt(r.label_accuracy, '.0%')} | {fmt(r.seconds, '.3f')} "
            f"| {r.note} |"
        )
    lines += ["", "Metrics: " + "; ".join(f"{k}: {v}" for k, v in report.metrics.items()), ""]
    lines += [f"- {note}" for note in report.notes]
    return "\n".join(lines) + "\n"


def app_fact_lines(facts: list[dict[str, str]]) -> list[str]:
    """``fedvit audit-app``: what it read from the app's code and data, each with its source and whose side used it."""
    if not facts:
        return []
    lines = ["Read from the app (`fedvit audit-app`):", "", "| what | value | source | used by |", "|---|---|---|---|"]
    lines += [f"| {f['what']} | {f['value']} | {f['source']} | {f['side']} |" for f in facts]
    return [*lines, ""]


def secure_lines(secure: SecureAggregation | None) -> list[str]:
    """Secure aggregation: what each observer holds, and per round its nodes and how the aggregate was obtained."""
    if not secure:
        return []
    lines = ["## Secure aggregation", "", f"{secure.protocol}. What each observer holds: {secure.observers}. "
             f"{secure.tls}.", ""]  # fmt: skip
    for r in secure.rounds:
        lines.append(
            f"- **{r.round}**: {len(r.sampled)} node(s) sampled, {len(r.survived)} sent a masked vector"
            + (f" ({len(r.dropped)} dropped: {', '.join(map(str, r.dropped))})" if r.dropped else "")
            + f"; threshold {r.settings.get('threshold')} of {r.settings.get('share_num')} shares; the "
            f"aggregate: {r.aggregate}"
            + gap_text(r.gap)
            + (f" (not rebuilt: {r.not_rebuilt})" if r.not_rebuilt is not None else "")
        )
    return lines + [""]


def summary_lines(rows: list[ClientFinding]) -> list[str]:
    """The summary table of the report's findings (:func:`fedvit.audit.summary.summary_table`)."""
    if not rows:
        return []
    legend = ("Each cell: **the finding** (leaks: beyond the null by the margin, its interval clear of it; no "
              "evidence: within it; could not have seen: within it, and so was a simulated update with known members; "
              "not resolvable: too few images or members for any figure to clear the null; not measured), the "
              "figure, the null that holds no information (membership's: the threshold a figure must exceed), its "
              "95% interval, and the audit's power.")
    return ["## Per client", "", *summary_table(rows), "", legend, ""]


def update_lines(updates: list[UpdateAudit]) -> list[str]:
    """Per update: what was sent, the recipe read, the labels, the strongest attack's scores, each attack's status."""
    if not updates:
        return []

    def unscored(value: float | None, spec: str) -> str:
        return "unscored" if value is None else format(value, spec)

    lines = ["## Updates", "", "| update | sent | B × steps | labels (recovered) | best attack | PSNR dB | SSIM "
             "| re-id top-1 | rank |", "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for u in updates:
        labels = "—" if u.labels is None else str(u.labels)
        best = u.best or ImageScores()
        lines.append(
            f"| {u.update} | {u.sent} | {u.batch} × {u.steps} | {labels} | {u.best_attack or '—'} "
            f"| {unscored(best.psnr, '.2f')} | {unscored(best.ssim, '.3f')} | {unscored(best.reid_top1, '.0%')} "
            f"| {unscored(best.reid_rank, '.1f')} |"
        )
    lines += ["", "### Attacks per update", ""]
    for u in updates:
        lines.append(f"- **{u.update}**: recipe: {u.recipe}")
        if u.assumptions:
            lines.append(f"  - assumed (no record carries them): {'; '.join(u.assumptions)}")
        if u.frozen_features:
            lines.append(f"  - frozen backbone: {u.frozen_features}")
        lines += [f"  - {name}: {status}" for name, status in u.attacks.items()
                  if not status.startswith(NOT_APPLICABLE)]  # fmt: skip
        lines += [f"  - evidence, {kind}: {evidence_text(e)}" for kind, e in u.leakage.items()]
        lines += [f"  - evidence, membership of {name}'s images in this aggregate: {evidence_text(e)}"
                  for name, e in (u.membership_members or {}).items()]  # fmt: skip
    return lines + [""] + not_applicable_lines(updates)


def not_applicable_lines(updates: list[UpdateAudit]) -> list[str]:
    """The attacks that did not apply, once per reason: which attacks, on which updates."""
    by_reason: dict[str, dict[str, list[str]]] = {}  # reason -> attack -> updates
    for u in updates:
        for name, status in u.attacks.items():
            if status.startswith(NOT_APPLICABLE):  # "withheld: <why>" and "<why>": one reason
                reason = status.removeprefix(NOT_APPLICABLE).removeprefix("withheld: ")
                by_reason.setdefault(reason, {}).setdefault(name, []).append(u.update)
    for reason in sorted(by_reason, key=len, reverse=True):  # the same why with more said: under the shorter one
        shorter = [r for r in by_reason if r != reason and reason.startswith(r + ";")]
        if shorter:
            for name, names in by_reason.pop(reason).items():
                by_reason[shorter[0]].setdefault(name, []).extend(names)
    if not by_reason:
        return []
    lines = ["### Attacks that did not apply", ""]
    for reason, attacks in by_reason.items():
        on = {tuple(names) for names in attacks.values()}
        where = "all updates" if on == {tuple(u.update for u in updates)} else "; ".join(
            ", ".join(names) for names in on)  # fmt: skip
        lines.append(f"- {', '.join(attacks)} ({where}): {reason}")
    return lines + [""]


def client_lines(clients: list[ClientRounds]) -> list[str]:
    """Per client with several updates: its membership over all of them."""
    if not clients:
        return []
    lines = ["### Membership per client, its updates combined", ""]
    lines += [f"- **{c.client}** ({len(c.updates)} updates: {', '.join(c.updates)}): "
              f"{evidence_text(c.membership)}" for c in clients]  # fmt: skip
    return lines + [""]


def evidence_text(e: Evidence) -> str:
    """One leakage type of one update: the figure beside its null and margin (see :mod:`fedvit.audit.evidence`)."""
    if e.status != MEASURED:
        return e.status + ": " + ((e.benchmarked_error if isinstance(e, LabelEvidence) else None) or e.why or "")
    verdict = "beyond the null" if e.clears else "within the null"
    if isinstance(e, LabelEvidence):
        return f"error {e.error:.1%} vs prior {e.null_error:.1%} (margin {e.margin:.0%}): {verdict}"
    if isinstance(e, ImageEvidence):
        return f"re-identified {e.top1:.0%} top-1 vs null {e.null_top1:.0%} (margin {e.margin:.0%}): {verdict}"
    f = e.figures
    if not e.clears and not e.resolvable:
        verdict = needed_text(e.members_to_resolve, f.members)
    rates = "; ".join(tpr_text(f, target) for target in ("0.001", "0.01"))
    others = ", ".join(f"{name} {s.auc:.3f}" for name, s in f.scores.items() if name != f.score)
    return (f"strongest of {len(f.scores)} score(s): {f.score}" + (f" (AUC of the others: {others})" if others
            else "") + f"; AUC {f.auc:.3f} (null: {null_text(f.null)}, the choice among {len(f.scores)} accounted "
            f"for); {rates}; {f.members} members, {f.non_members} non-members ({f.non_member_source}), FPR "
            f"resolution {f.fpr_resolution:.2%} (the fewest non-members of a member's class: "
            f"{f.non_members_per_class}): {verdict}" + power_text(e.power) + privacy_text(e.privacy))  # fmt: skip


def privacy_text(privacy: PrivacyEvidence | None) -> str:
    """The empirical ε the membership test proves, against the client's DP claim where it makes one."""
    if privacy is None:
        return ""
    text = (f"; empirical ε ≥ {privacy.empirical_epsilon:.2f} (δ {privacy.delta:g}, {privacy.confidence:.0%} "
            f"confidence over {privacy.thresholds} thresholds; {privacy.members} members against "
            f"{privacy.non_members} non-members; null {privacy.null:.2f}, the largest of {privacy.null_draws} "
            "within-class shuffles)")  # fmt: skip
    if privacy.claimed_epsilon is None:
        return text
    return text + (": consistent with" if privacy.consistent else ": violates") + f" the claimed {privacy.claim}"


def parametric_text(f: Judgement) -> str:
    """TPR at 0.1% FPR from the per-class Gaussian fit (LiRA's offline test), where it agrees with the empirical CDF."""
    check = f.fit_check
    if check is None or f.parametric is None:
        return ""
    passed = f"{check.found:.2%} of the non-members pass its {check.target:.0%} threshold"
    if not check.agrees:
        return f"; a per-class Gaussian fit disagrees with the empirical CDF ({passed}): no parametric figure"
    return (f"; parametric {f.parametric:.1%} (null: {threshold_text(f.null.parametric, 'TPR')}; a per-class "
            f"Gaussian fit of the non-members, LiRA's offline test, agreeing with the empirical CDF: "
            f"{passed})")  # fmt: skip


def power_text(power: PowerEvidence | None) -> str:
    """What the audit could have seen: the simulated update with known members beside this one (same scores)."""
    if power is None:
        return ""
    if power.status != MEASURED:
        return f"; power not measured ({power.why})"
    sim = power.simulated
    like = (f"an aggregate of {power.aggregate_of} clients like this one, simulated with known members, shows for "
            f"{sim.members} of their images AUC" if power.aggregate_of else
            f"an update like this one, simulated with {sim.members} known members, shows AUC")  # fmt: skip
    seen = power.could_have_seen
    return (f"; power of the loss scores: {like} {sim.auc:.3f} (null: {null_text(sim.null)}; {sim.score}), "
            + ("beyond" if seen else "within") + " its null: the audit " + ("could" if seen else "could not")
            + f" have seen membership like it; this one shows AUC {power.observed_auc:.3f} with the same scores")


def tpr_text(f: Judgement, target: str) -> str:
    """TPR at one FPR target with its 95% interval and the FPR reached, or what resolving the target needs."""
    name = f"TPR@{float(target):.1%}".replace(".0%", "%") + " FPR"
    point = f.operating_points[target]
    if f.tpr(target) is None:
        return f"{name} not resolved (needs ≥ {point.needs} non-members per class)" + (
            parametric_text(f) if target == "0.001" else "")
    low, high = point.tpr_ci
    return (f"{name} {f.tpr(target):.1%} [{low:.1%}, {high:.1%}] at FPR {point.fpr:.2%} "
            f"(null: {threshold_text(f.null.tpr(target), 'TPR')})")  # fmt: skip


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
    ranks = ranks or [{} for _ in images]
    panels = []  # (row label, truth, {attack: image}, {attack: caption})
    for (obs, truth, recs), update_ranks in zip(images, ranks, strict=True):
        truths = as_batch(truth)
        if truths is None:
            panels.append((obs.meta.get("label", ""), None, {n: r.image for n, r in recs.items()}, {}))
            continue
        matched = {n: matched_images(r, truths) for n, r in recs.items()}
        for j, t in enumerate(truths[:GRID_IMAGES_PER_UPDATE]):
            label = obs.meta.get("label", "") + (f" #{j}" if len(truths) > 1 else "")
            ranked = {n: f"re-id rank {r[j]:g}" for n, r in update_ranks.items()
                      if r is not None and matched[n].get(j) is not None}  # fmt: skip
            panels.append((label, t, {n: m.get(j) for n, m in matched.items()}, ranked))
    columns = list(dict.fromkeys(n for _, _, recs in images for n in recs))
    draw_grid(panels, columns, path)


def draw_grid(panels: list[tuple], columns: list[str], path: Path, title: str = "", dpi: int = 130) -> None:
    """Image grid: per panel row (label, true image, {column: image}, {column: caption}) the original, then one
    image per column (blank where there is none), each with its caption under it."""
    from fedvit.core.plots import plt

    if not panels:
        return
    cols = 1 + len(columns)
    fig, axes = plt.subplots(len(panels), cols, figsize=(1.6 * cols, 1.7 * len(panels)), squeeze=False)
    for i, (label, truth, recs, captions) in enumerate(panels):
        for j, (name, img) in enumerate([("original", truth)] + [(n, recs.get(n)) for n in columns]):
            ax = axes[i, j]
            ax.axis("off")
            if img is not None:
                ax.imshow(np.transpose(img, (1, 2, 0)))
            if name in captions:
                ax.text(0.5, -0.04, captions[name], transform=ax.transAxes, fontsize=5, ha="center", va="top")
            if i == 0:
                ax.set_title(textwrap.fill(name, 24), fontsize=6)  # long attack names would overlap
        axes[i, 0].text(-0.1, 0.5, label, transform=axes[i, 0].transAxes, fontsize=6, ha="right", va="center")
    if title:
        fig.suptitle(title, fontsize=7)
    fig.tight_layout(rect=(0, 0, 1, 0.97) if title else (0, 0, 1, 1))  # keep a title clear of the headings
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
