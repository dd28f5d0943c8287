"""Membership of each SecAgg+ member's images in the aggregate: the aggregate's membership scores, taken once on
the union of the members' images, split by member, each part judged against its own null (the same within-class
label shuffles) exactly as an update of that client's own would be. What the server learns of each client from the
sum, at that N."""

from __future__ import annotations

import dataclasses

from fedvit.attacks.holdings import Candidates
from fedvit.attacks.membership import LOSS_SCORES
from fedvit.attacks.scores import Score, evenly_kept
from fedvit.audit.evidence import NOT_MEASURED, MembershipEvidence, PowerEvidence, membership_evidence
from fedvit.audit.membership_stats import judge

IN_AGGREGATE = "its images in the SecAgg+ aggregate"  # what a member's membership evidence measures


def member_membership(scores: list[Score], candidates: Candidates, seed: int, slices: list[tuple[str, int, int]],
                      power: PowerEvidence | None) -> dict[str, MembershipEvidence]:  # fmt: skip
    """Per member (its name, and the [start, stop) of its images among ``candidates.members``), the membership
    evidence of its images alone in the aggregate, against the same non-members; its ``power`` the simulated
    aggregate's for one member (``power``: the aggregate's membership power, with ``per-member`` where it ran)."""
    images, labels = candidates.members
    kept = evenly_kept(len(images))
    aligned = all(len(s.members) == len(kept) for s in scores)
    out: dict[str, MembershipEvidence] = {}
    for name, start, stop in slices:
        inside = (kept >= start) & (kept < stop)
        if not aligned:
            found = membership_evidence(None, "the scores do not line up with the members' images")
        elif not inside.any():
            found = membership_evidence(None, "none of its images among the membership candidates")
        else:
            chosen = kept[inside]
            own = dataclasses.replace(candidates, members=(images[chosen], labels[chosen]))
            part = [dataclasses.replace(s, members=s.members[inside]) for s in scores]
            found = membership_evidence(judge(part, own, seed)[0], "", measures=IN_AGGREGATE)
        out[name] = dataclasses.replace(found, power=member_power(found, power))
    return out


def member_power(found: MembershipEvidence, power: PowerEvidence | None) -> PowerEvidence:
    """What the audit could see of one client's images at this N (the simulated aggregate's ``per_member``), beside
    the AUC the same loss scores show on this member's images."""
    twin = None if power is None else power.per_member
    if twin is None or not found.measured:
        return PowerEvidence(NOT_MEASURED, power.why if power is not None and power.why else "no simulated aggregate")
    observed = [s.auc for n, s in found.figures.scores.items() if n in LOSS_SCORES]
    return dataclasses.replace(twin, observed_auc=max(observed) if observed else float("nan"))
