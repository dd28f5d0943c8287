"""Membership of each SecAgg+ member's images in the aggregate: the aggregate's membership scores, taken once on
the union of the members' images, split by member, each part judged against its own null (the same within-class
label shuffles) exactly as an update of that client's own would be. What the server learns of each client from the
sum, at that N."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from fedvit.attacks.membership_stats import MAX_CANDIDATES, Score, judge
from fedvit.attacks.reidentification import evenly_spaced
from fedvit.audit.evidence import membership_evidence

IN_AGGREGATE = "its images in the SecAgg+ aggregate"  # what a member's membership evidence measures


def member_membership(scores: list[Score], candidates: Any, seed: int,
                      slices: list[tuple[str, int, int]]) -> dict[str, dict[str, Any]]:  # fmt: skip
    """Per member (its name, and the [start, stop) of its images among ``candidates.members``), the membership
    evidence of its images alone in the aggregate, against the same non-members."""
    images, labels = candidates.members
    kept = evenly_spaced(len(images), MAX_CANDIDATES) if len(images) > MAX_CANDIDATES else np.arange(len(images))
    out: dict[str, dict[str, Any]] = {}
    for name, start, stop in slices:
        inside = (kept >= start) & (kept < stop)
        if any(len(s.members) != len(kept) for s in scores):
            out[name] = membership_evidence(None, "the scores do not line up with the members' images")
        elif not inside.any():
            out[name] = membership_evidence(None, "none of its images among the membership candidates")
        else:
            chosen = kept[inside]
            own = dataclasses.replace(candidates, members=(images[chosen], labels[chosen]))
            part = [dataclasses.replace(s, members=s.members[inside]) for s in scores]
            result, _, _ = judge(part, own, seed)
            out[name] = membership_evidence(result, "") | {"measures": IN_AGGREGATE}
    return out
