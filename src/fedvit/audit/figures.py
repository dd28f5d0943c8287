"""The report's pictures (matplotlib): per client the membership ROC with its null band, and per update the label
counts recovered against the prior and the truth. Each is a figure the caller saves as a file or embeds."""

from __future__ import annotations

import io
from typing import Any

import numpy as np

from fedvit.audit.entries import UpdateAudit
from fedvit.audit.membership_stats import Roc, split_roc, within_class_shuffles
from fedvit.audit.summary import client_of

BAND_DRAWS = 200  # within-class shuffles behind the ROC's null band
BAND = (0.025, 0.975)  # the band's quantiles over the shuffles
MAX_LABEL_PANELS = 12  # label-count panels drawn (the rest: audit.json)
SHORT_AXIS = (0.2, 0.5)  # the minor ticks labelled on a ROC axis shorter than a decade


def tpr_at(roc: tuple[np.ndarray, np.ndarray], grid: np.ndarray) -> np.ndarray:
    """The ROC's TPR at each FPR of ``grid`` (the best threshold whose FPR does not exceed it)."""
    fpr, tpr = roc
    return np.maximum.accumulate(tpr)[np.searchsorted(fpr, grid, side="right") - 1]


def null_band(roc: Roc, grid: np.ndarray, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """TPR at ``grid`` on the same values with member and non-member labels shuffled within each class (the audit's
    null, :func:`fedvit.audit.membership_stats.within_class_shuffles`): the :data:`BAND` quantiles."""
    values = np.concatenate([roc.members, roc.non_members])
    classes = np.concatenate([roc.member_classes, roc.non_member_classes])
    is_member = np.r_[np.ones(len(roc.members), bool), np.zeros(len(roc.non_members), bool)]
    rates = []
    for mask in within_class_shuffles(is_member, classes, BAND_DRAWS, seed):
        fpr, tpr, _ = split_roc(values[mask], values[~mask])
        rates.append(tpr_at((fpr, tpr), grid))
    low, high = np.quantile(np.array(rates), BAND, axis=0)
    return low, high


def short_axis_label(value: float, _position: int) -> str:
    """A minor tick's label on a ROC axis within one decade: only :data:`SHORT_AXIS`'s, in plain numbers."""
    return f"{value:g}" if np.isclose(value, SHORT_AXIS).any() else ""


def roc_figure(clients: dict[str, list[tuple[str, Roc]]]) -> Any:
    """Log–log ROC, one panel per client and one curve per update (short labels), drawn only above the FPR
    resolution (marked), over the null's band; the diagonal is chance."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    from fedvit.core.plots import plt

    cols = min(3, len(clients))
    rows = -(-len(clients) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.4 * cols, 3.3 * rows), squeeze=False)
    for ax in axes.flat[len(clients):]:
        ax.axis("off")
    for ax, (client, curves) in zip(axes.flat, clients.items(), strict=False):
        floor = min(roc.resolution for _, roc in curves)
        for k, (label, roc) in enumerate(curves):
            grid = np.geomspace(roc.resolution, 1, 60)
            low, high = null_band(roc, grid)
            ax.fill_between(grid, np.maximum(low, floor / 2), np.maximum(high, floor / 2), color="0.8",
                            alpha=0.6, lw=0, label="null (95% of shuffles)" if k == 0 else None)  # fmt: skip
            fpr, tpr, auc = split_roc(roc.members, roc.non_members)
            keep = fpr >= roc.resolution
            ax.step(fpr[keep], np.maximum(tpr[keep], floor / 2), where="post", lw=1.2, label=f"{label} (AUC {auc:.2f})")
        ax.plot([floor / 2, 1], [floor / 2, 1], "k--", lw=0.7, label="chance")
        ax.axvline(floor, color="0.4", ls=":", lw=0.8)
        ax.text(floor * 1.15, 0.97, f"FPR resolution {floor:.1%}", fontsize=6, rotation=90, ha="left", va="top",
                transform=ax.get_xaxis_transform())  # fmt: skip
        ax.set(xscale="log", yscale="log", xlim=(floor / 2, 1), ylim=(floor / 2, 1.05), xlabel="false positive rate",
               ylabel="true positive rate")  # fmt: skip
        for axis in (ax.xaxis, ax.yaxis):  # matplotlib labels every minor tick of a short log axis: they collide
            if floor / 2 < 0.1:  # two decades or more: decades only
                axis.set_minor_formatter(NullFormatter())
            else:  # within one decade (a handful of non-members): 0.2, 0.5 and 1 in plain numbers
                axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
                axis.set_minor_formatter(FuncFormatter(short_axis_label))
        ax.tick_params(which="both", labelsize=7)
        ax.set_title(client, fontsize=8)
        ax.legend(fontsize=6, loc="lower right")
    fig.tight_layout()
    return fig


def label_figure(updates: list[UpdateAudit]) -> Any | None:
    """Per update the recovered class counts beside the prior's (N × its class shares) and the true counts where the
    scoring data gives them; None where no update has counts."""
    from fedvit.core.plots import plt

    drawn = [u for u in updates if u.labels][:MAX_LABEL_PANELS]
    if not drawn:
        return None
    cols = min(3, len(drawn))
    rows = -(-len(drawn) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 2.6 * rows), squeeze=False)
    for ax in axes.flat[len(drawn):]:
        ax.axis("off")
    for ax, u in zip(axes.flat, drawn, strict=False):
        evidence = u.labels_evidence
        recovered = {int(c): n for c, n in u.labels.items()}
        shares = evidence.prior_shares
        classes = len(shares) if shares else max(recovered) + 1
        x = np.arange(classes)
        total = sum(recovered.values())
        ax.bar(x - 0.2, [recovered.get(c, 0) for c in x], 0.4, label="recovered", color="tab:red")
        if evidence.true_counts is not None:
            ax.bar(x + 0.2, evidence.true_counts[:classes], 0.4, label="true", color="tab:blue")
        if shares:
            ax.plot(x, np.array(shares) * total, "k_", ms=10, mew=1.5, label="prior (no information)")
        ax.set_title(short_update(u), fontsize=8)
        ax.set(xticks=x, xlabel="class", ylabel="images")
        ax.tick_params(labelsize=6)
        ax.legend(fontsize=6)
    fig.tight_layout()
    return fig


def short_update(update: UpdateAudit) -> str:
    """An update's short name: its client and round ("partition 0, round 2")."""
    return f"{client_of(update)}, round {update.round}" if update.round is not None else update.update


def png(fig: Any, dpi: int = 110) -> bytes:
    """The figure as PNG bytes (closed afterwards)."""
    from fedvit.core.plots import plt

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight")
    plt.close(fig)
    return buffer.getvalue()
