"""The report's first screen: per client and leakage type one finding (the figure, its null, its 95% interval, the
audit's power and one word), and a verdict of at most three short lines built from those findings.

The words follow from the figures (:mod:`fedvit.audit.evidence` holds the one rule per leakage type): "leaks" (the
figure clears its null by the margin and its interval lies clear of the null), "no evidence" (resolvable, and within
the null), "could not have seen" (within the null, and a simulated update like this one with known members was
within its null too: at this budget the audit had no power to see such leakage), "not resolvable" (too few images,
members or non-members for any figure to clear the null: how many would be needed), "not measured" (with why).
Where no client's own evidence clears its null but the clients' together does (each count exact, too few images
each), the verdict says so of the clients together (:func:`together`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from fedvit.audit.entries import ClientRounds, UpdateAudit
from fedvit.audit.evidence import (
    MEASURED,
    NOT_MEASURED,
    ImageEvidence,
    LabelEvidence,
    MembershipEvidence,
    claims_tested,
    counted,
    images_clear,
    label_images_needed,
    labels_clear,
    needed_text,
    null_text,
)
from fedvit.audit.membership_stats import clopper_pearson
from fedvit.audit.secagg import AGGREGATE

LEAKS, NO_EVIDENCE, UNSEEABLE, NOT_RESOLVABLE = "leaks", "no evidence", "could not have seen", "not resolvable"
KINDS = ("labels", "membership", "images", "DP claim")
FINDING_FIELDS = ("labels", "membership", "images", "dp_claim")  # ClientFinding's field of each kind, in order


@dataclasses.dataclass(frozen=True)
class Finding:
    """One leakage type of one client, as the summary table states it (each field is display text; "—": none)."""

    word: str  # leaks | no evidence | could not have seen | not resolvable | not measured
    figure: str = "—"
    null: str = "—"
    interval: str = "—"  # 95% interval of the figure
    power: str = "—"  # what a simulated update with known members showed (membership only)
    why: str = ""  # not measured: the reason

    def cell(self) -> str:
        """The finding in one table cell: the word first, then the figure, its null, interval and power."""
        if self.word == NOT_MEASURED:
            return f"**{self.word}**" + (f": {self.why}" if self.why else "")
        parts = [self.figure, f"null: {self.null}"]
        parts += [f"95% CI {self.interval}"] if self.interval != "—" else []
        parts += [f"power: {self.power}"] if self.power != "—" else []
        return f"**{self.word}**: " + "; ".join(parts)


@dataclasses.dataclass(frozen=True)
class ClientFinding:
    """One client's row of the summary: its updates and one finding per leakage type."""

    client: str  # "partition P" where the scoring data maps it, else "node N"
    updates: tuple[str, ...]
    labels: Finding
    membership: Finding
    images: Finding
    dp_claim: Finding

    def by_kind(self) -> dict[str, Finding]:
        return dict(zip(KINDS, (getattr(self, name) for name in FINDING_FIELDS), strict=True))


def _ci(low: float, high: float) -> str:
    return f"[{low:.1%}, {high:.1%}]"


def label_finding(updates: list[UpdateAudit]) -> Finding:
    """Label counts over a client's updates: the share of its images they misplace against the prior's, of its
    strongest update (:func:`strongest_labels`; its updates train on the same images, so they are not pooled), judged
    by :func:`fedvit.audit.evidence.labels_clear` with that update's interval."""
    found = [u.labels_evidence for u in updates]
    measured = [e for e in found if e.status == MEASURED]
    if not measured:
        e = found[0]
        if e.status != NOT_MEASURED:  # estimated, nothing to score it against
            return Finding(NOT_MEASURED, why=f"counts estimated, unverified ({e.why})")
        return Finding(NOT_MEASURED, why=e.why)
    e = strongest_labels(measured)
    images = judged_on(e)
    hits = sum(m.clears for m in measured)
    figure = f"error {e.error:.1%}" + (f" ({hits} of {len(measured)} updates beyond)" if len(measured) > 1 else "")
    interval = _ci(*clopper_pearson(round(e.error * images), images))
    word = LEAKS if hits else NO_EVIDENCE
    if not hits and not any(labels_clear(0.0, m.null_error, judged_on(m)) for m in measured):
        need = label_images_needed(e.null_error)
        figure += (f"; not resolvable with {counted(images, 'image')}: " + (
            "the prior is within the margin of exact" if need is None else f"exact counts need ≥ {need} to clear "
            "the prior"))  # fmt: skip
        word = NOT_RESOLVABLE
    return Finding(word, figure, f"{e.null_error:.1%} (the prior)", interval)


def judged_on(e: LabelEvidence | ImageEvidence) -> int:
    """The images an update's label or image evidence was judged on."""
    return int(e.images or 1)


def strongest_labels(measured: list[LabelEvidence]) -> LabelEvidence:
    """The update whose label counts lie furthest below the prior (the upper end of their interval)."""
    return min(measured, key=lambda e: clopper_pearson(round(e.error * judged_on(e)), judged_on(e))[1]
               - e.null_error)  # fmt: skip


def membership_finding(updates: list[UpdateAudit], combined: MembershipEvidence | None) -> Finding:
    """Membership of a client's images: over its updates combined where there are several, else its one update.
    A null is printed as the threshold it is (:func:`fedvit.audit.evidence.null_text`)."""
    found = [u.membership for u in updates]
    return membership_row([e for e in found if e.measured], combined, found[0].why if found else "", len(updates))


def membership_row(measured: list[MembershipEvidence], combined: MembershipEvidence | None, why: str,
                   updates: int) -> Finding:  # fmt: skip
    """The membership finding of measured updates, or of their ``combined`` evidence where measured."""
    if combined is not None and combined.measured:
        e = combined
    elif measured:
        e = max(measured, key=lambda m: m.figures.auc - m.figures.null.auc)
    else:
        return Finding(NOT_MEASURED, why=combined.why if combined else why)
    f = e.figures
    at = f.judged_at
    point = f.operating_points[at]
    fpr = 0.01 if at == "0.01" else point.fpr if point.fpr is not None else f.fpr_resolution
    tpr = f.tpr(at)
    figure = f"AUC {f.auc:.3f}" + ("" if tpr is None else f", TPR {tpr:.1%} at FPR {fpr:.1%}")
    if combined is e:
        figure += f" ({updates} updates combined)"
    null = null_text(f.null, at, f.members)
    power, word = "—", LEAKS if e.clears else NO_EVIDENCE
    if not e.clears and not e.resolvable:  # membership_evidence's reach of the null
        figure += f"; {needed_text(e.members_to_resolve, f.members)}"
        word = NOT_RESOLVABLE
    powers = [p for m in ([e] if combined is not e else measured) if (p := m.power) is not None
              and p.status == MEASURED]  # fmt: skip
    if powers:
        seen = sum(p.could_have_seen for p in powers)
        auc = sum(p.simulated.auc for p in powers) / len(powers)
        power = f"simulated AUC {auc:.3f}, beyond its null in {seen} of {len(powers)}"
        if word == NO_EVIDENCE and seen == 0:
            word = UNSEEABLE
    return Finding(word, figure, null, "—" if point.tpr_ci is None else "TPR " + _ci(*point.tpr_ci), power)


def image_finding(updates: list[UpdateAudit]) -> Finding:
    """Images: the best attack's re-identification (top-1) against the same reconstructions among unseen images, of
    the client's strongest update (its updates hold the same images, so they are not pooled), judged by
    :func:`fedvit.audit.evidence.images_clear`."""
    found = [u.images for u in updates]
    measured = [e for e in found if e.status == MEASURED]
    if not measured:
        why = found[0].why
        skipped = [status for status in updates[0].attacks.values() if "not attempted: " in status]
        if skipped:  # no image attack ran: say why the inversions were not attempted
            why = skipped[0].split("not attempted: ", 1)[1]
        return Finding(NOT_MEASURED, why=short_reason(why))
    e = strongest_images(measured)
    images = judged_on(e)
    hits = round(e.top1 * images)
    figure = f"re-identified {e.top1:.0%} top-1" + (f", {e.psnr:.1f} dB" if e.psnr is not None else "")
    word = LEAKS if e.clears else NO_EVIDENCE
    if word != LEAKS and not any(images_clear(1.0, m.null_top1, m.chance, judged_on(m))
                                 for m in measured):  # not even every image re-identified would clear  # fmt: skip
        figure += f"; not resolvable with {counted(images, 'image')}"
        word = NOT_RESOLVABLE
    return Finding(word, figure, f"{e.null_top1:.0%}", _ci(*clopper_pearson(hits, images)))


def strongest_images(measured: list[ImageEvidence]) -> ImageEvidence:
    """The update whose re-identification clears its null, else lies furthest above it."""
    return max(measured, key=lambda m: (m.clears, m.top1 - m.null_top1))


def dp_finding(updates: list[UpdateAudit]) -> Finding:
    """A DP claim on record: the empirical ε the membership test proves, against the claimed ε."""
    claims = claims_tested([u.membership for u in updates])
    if not claims:
        central = next((text for u in updates for key, text in u.recipe_sources if key == "central DP"), None)
        if central is not None:  # the noise is the server's, on the aggregate: no update carries it to be tested
            return Finding(NOT_MEASURED, why="central DP in the app's code: the server noises the aggregate, and "
                           "no update carries that noise (no ε of an update to test)")  # fmt: skip
        return Finding(NOT_MEASURED, why="no DP claim on record")
    worst = max(claims, key=lambda p: p.empirical_epsilon)
    broken = [p for p in claims if not p.consistent]
    figure = f"ε ≥ {worst.empirical_epsilon:.2f} against the claimed {worst.claim}"
    interval = f"one-sided, {worst.confidence:.0%} confidence"
    return Finding(LEAKS if broken else NO_EVIDENCE, figure, f"ε {worst.null:.2f}", interval)


def short_reason(why: str) -> str:
    """A reason's first clause (the table cell; the update detail keeps the whole reason)."""
    return why.split(" (")[0].split(";")[0].removeprefix("not attempted: ")


AGGREGATE_ROW = "the aggregate (SecAgg+)"
MASKED = "masked by SecAgg+: not measurable from a masked vector"


def client_of(update: UpdateAudit) -> str:
    """Whose update this is: its partition where known (the scoring data's mapping), else its node; a SecAgg+
    round's aggregate is the server's view of all its clients."""
    if update.node == AGGREGATE:
        return AGGREGATE_ROW
    return f"partition {update.partition}" if update.partition is not None else f"node {update.node}"


def client_name(node: Any, recorded: int | None, data: Any) -> str:
    """A node's row name where no update of its own was audited: its partition where the scoring data maps it, else
    the one its node config recorded, else the node."""
    partition = recorded if data is None else data.partitions.get(str(node), recorded)
    return f"partition {partition}" if partition is not None else f"node {node}"


def client_findings(updates: list[UpdateAudit], clients: list[ClientRounds],
                    masked: list[str] = ()) -> list[ClientFinding]:  # fmt: skip
    """One row per client (:func:`client_of` its updates), in audit order; ``clients``: membership combined;
    ``masked``: clients whose updates SecAgg+ masked (every figure: not measurable)."""
    grouped: dict[str, list[UpdateAudit]] = {}
    for u in updates:
        grouped.setdefault(client_of(u), []).append(u)
    combined = {c.client: c.membership for c in clients}
    rows = [
        ClientFinding(
            client, tuple(u.update for u in mine), label_finding(mine),
            membership_finding(mine, combined.get(client)), image_finding(mine), dp_finding(mine),
        )  # fmt: skip
        for client, mine in grouped.items()
    ]
    hidden = Finding(NOT_MEASURED, why=MASKED)
    in_aggregate: dict[str, list[MembershipEvidence]] = {}  # a masked client's images in the aggregates
    for u in updates:
        for name, e in (u.membership_members or {}).items():
            in_aggregate.setdefault(name, []).append(e)
    rows += [ClientFinding(c, (), hidden, member_finding(in_aggregate.get(c, [])), hidden, hidden)
             for c in dict.fromkeys(masked) if c not in grouped]  # fmt: skip
    return sorted(rows, key=lambda f: client_order(f.client))


def member_finding(found: list[MembershipEvidence]) -> Finding:
    """A SecAgg+ member's membership: of its images in the aggregates it joined (the strongest round), else not
    measured (masked)."""
    measured = [e for e in found if e.measured]
    if not measured:
        return Finding(NOT_MEASURED, why=MASKED)
    row = membership_row(measured, None, "", len(measured))
    return dataclasses.replace(row, figure=f"its images in the aggregate: {row.figure}")


def client_order(client: str) -> tuple[int, int | str]:
    """The aggregate first, then partitions in number order, then nodes."""
    kind, _, number = client.partition(" ")
    rank = 0 if client == AGGREGATE_ROW else 1 if kind == "partition" else 2
    return (rank, int(number) if number.isdigit() else number)


def short_verdict(findings: list[ClientFinding], nothing: str, secured: bool = False, jointly: str = "") -> str:
    """At most three lines: what leaks (and for how many clients), or what leaks only of the clients together
    (``jointly``, :func:`together`); what showed no evidence, could not have been seen or could not be resolved;
    and what was not measured. ``secured`` (SecAgg+): the first line says whose figures these are."""
    if not findings:
        return nothing
    if secured:
        return secured_verdict(findings)
    n = len(findings)
    words = {kind: [f.by_kind()[kind].word for f in findings] for kind in KINDS}

    def listed(word: str) -> str:
        return ", ".join(f"{kind} ({ws.count(word)} of {n} client{'s' * (n > 1)})" for kind, ws in words.items()
                         if word in ws)  # fmt: skip

    first = f"LEAKS: {listed(LEAKS)}." if listed(LEAKS) else "No leakage found at this budget."
    if jointly:
        first = (first[:-1] + "; " if listed(LEAKS) else "No client's own figure clears its null; ") + jointly
    lines = [first]
    quiet = [f"{label}: {listed(word)}" for label, word in (("No evidence", NO_EVIDENCE),
             ("could not have seen", UNSEEABLE), ("not resolvable", NOT_RESOLVABLE)) if listed(word)]  # fmt: skip
    if quiet:
        lines.append("; ".join(quiet) + ".")
    unmeasured = [kind for kind, ws in words.items() if all(w == NOT_MEASURED for w in ws)]
    if unmeasured:
        lines.append(f"Not measured: {', '.join(unmeasured)}.")
    if not any(listed(w) for w in (LEAKS, NO_EVIDENCE, UNSEEABLE, NOT_RESOLVABLE)):
        lines[0] = "Unverified: nothing could be scored (no ground truth recorded and no --data)."
    return "\n".join(line[0].upper() + line[1:] for line in lines)


def together(said: dict[str, str]) -> str:
    """:func:`jointly_leaking`'s statements as the verdict's sentence ("" where nothing is to be said)."""
    return ("Together: " + "; ".join(said.values()) + ".") if said else ""


def jointly_leaking(updates: list[UpdateAudit], findings: list[ClientFinding]) -> dict[str, str]:
    """The clients together, where none's own evidence of a leakage type leaks but their pooled evidence does
    (label counts over all their images against the prior's error, re-identification over all their images), by
    the same rule as each client's: the leakage type → what was found. Each client counts once, by its strongest
    update (its rounds hold the same images); the SecAgg+ aggregate is not a client."""
    mine: dict[str, list[UpdateAudit]] = {}
    for u in updates:
        if client_of(u) != AGGREGATE_ROW:
            mine.setdefault(client_of(u), []).append(u)
    if len(mine) < 2:
        return {}
    said: dict[str, str] = {}
    measured = lambda us, kind: [u.leakage[kind] for u in us if u.leakage[kind].status == MEASURED]  # noqa: E731
    labels = [strongest_labels(m) for us in mine.values() if (m := measured(us, "labels"))]
    if len(labels) > 1 and not any(f.labels.word == LEAKS for f in findings):
        images = sum(judged_on(e) for e in labels)
        misplaced = sum(e.error * judged_on(e) for e in labels)
        null = sum(e.null_error * judged_on(e) for e in labels) / images
        if labels_clear(misplaced / images, null, images):
            low, high = clopper_pearson(round(misplaced), images)
            said["labels"] = (f"labels of the {len(labels)} clients together beyond the prior ({round(misplaced)} "
                              f"of {images} images misplaced, 95% CI [{low:.1%}, {high:.1%}], prior {null:.1%}; "
                              f"{sum(e.error == 0 for e in labels)} exactly right)")  # fmt: skip
    pictures = [strongest_images(m) for us in mine.values() if (m := measured(us, "images"))]
    if len(pictures) > 1 and not any(f.images.word == LEAKS for f in findings):
        sizes = [judged_on(e) for e in pictures]
        images = sum(sizes)
        hits = round(sum(e.top1 * n for e, n in zip(pictures, sizes, strict=True)))
        null = sum(e.null_top1 * n for e, n in zip(pictures, sizes, strict=True)) / images
        chance = sum((e.chance or 0.0) * n for e, n in zip(pictures, sizes, strict=True)) / images
        if images_clear(hits / images, null, chance, images):
            said["images"] = (f"images of the {len(pictures)} clients together re-identified ({hits} of {images} "
                              f"top-1, null {null:.0%})")  # fmt: skip
    return said


def summary_table(findings: list[ClientFinding]) -> list[str]:
    """The markdown table: one row per client, one cell per leakage type."""
    lines = ["| client | updates | " + " | ".join(KINDS) + " |", "|---" * (2 + len(KINDS)) + "|"]
    for f in findings:
        cells = " | ".join(x.cell() for x in f.by_kind().values())
        lines.append(f"| {f.client} | {len(f.updates)} | {cells} |")
    return lines


def secured_verdict(findings: list[ClientFinding]) -> str:
    """SecAgg+: each client's update is masked, so the verdict is the aggregate's (the server's view)."""
    masked = sum(f.labels.why == MASKED for f in findings)
    aggregate = next((f for f in findings if f.client == AGGREGATE_ROW), None)
    lines = [f"SecAgg+: the {masked} clients' updates are masked (nothing measurable per client); the figures are "
             "the aggregate's, which the server rebuilds."]  # fmt: skip
    if aggregate is None:
        return lines[0] + "\nNot measured: the aggregate was not obtained from the captures."
    kinds = aggregate.by_kind()
    members = [f.membership for f in findings if f.client != AGGREGATE_ROW and f.labels.why == MASKED]
    each = sum(m.word == LEAKS for m in members)
    for label, words in (("LEAKS from the aggregate", (LEAKS,)), ("No evidence", (NO_EVIDENCE, UNSEEABLE)),
                         ("Not resolvable", (NOT_RESOLVABLE,))):
        found = [kind for kind, f in kinds.items() if f.word in words]
        if label.startswith("LEAKS") and each:
            found.append(f"membership of {each} of {len(members)} clients' own images")
        if found:
            lines.append(f"{label}: {', '.join(found)}.")
    if len(lines) < 3 and (unmeasured := [kind for kind, f in kinds.items() if f.word == NOT_MEASURED]):
        lines.append(f"Not measured: {', '.join(unmeasured)}.")
    return "\n".join(lines[:3])
