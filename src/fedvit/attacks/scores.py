"""A membership score as the attacks give it: its values on the candidates they score (at most
:data:`MAX_CANDIDATES` per side, :func:`evenly`). How a score is judged against the truth and its null is the
audit's (:mod:`fedvit.audit.membership_stats`)."""

from __future__ import annotations

import dataclasses

import numpy as np

from fedvit.attacks.reidentification import evenly_spaced

MAX_CANDIDATES = 5000  # per side; more are subsampled (evenly)


def evenly(images: np.ndarray, labels: np.ndarray, most: int = MAX_CANDIDATES) -> tuple[np.ndarray, np.ndarray]:
    """At most ``most`` of the images (evenly spaced) with their labels."""
    if len(images) <= most:
        return images, labels
    keep = evenly_kept(len(images), most)
    return images[keep], labels[keep]


def evenly_kept(count: int, most: int = MAX_CANDIDATES) -> np.ndarray:
    """The indices :func:`evenly` keeps of ``count`` images."""
    return evenly_spaced(count, most) if count > most else np.arange(count)


@dataclasses.dataclass(frozen=True)
class Score:
    """One membership score of an update's candidates, a higher value meaning member: its name, how it was
    computed, its raw values on the members and on the non-members, and whether it is judged calibrated per class
    or as it is (one threshold for every class, as the plain loss attack sets it)."""

    name: str
    reference: str
    members: np.ndarray
    non_members: np.ndarray
    per_class: bool = True
