"""What an attacker holds beside the update, shared by every attack that uses it: labelled images that are not the
client's (:class:`Auxiliary`, the simulations' data) and membership's candidates (:class:`Candidates`)."""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class Auxiliary:
    """Images [n, C, H, W] in [0, 1] with labels, none of them the client's: what the attacker simulates with."""

    images: np.ndarray
    labels: np.ndarray
    source: str
    noise: np.ndarray | None = None  # inputs standing in for a class none of the images has (None: fresh noise)

    def prior(self, num_classes: int) -> np.ndarray:
        """Class shares of the auxiliary data (the population's, as far as the attacker knows it)."""
        counts = np.bincount(self.labels, minlength=num_classes)[:num_classes].astype(np.float64)
        return counts / counts.sum() if counts.sum() else np.full(num_classes, 1 / num_classes)


@dataclasses.dataclass(frozen=True)
class Candidates:
    """Member and non-member images [n, C, H, W] in [0, 1] with their labels, and where the non-members came from;
    ``canaries``: planted images, each in the client's training with probability ½ (members: those included)."""

    members: tuple[np.ndarray, np.ndarray]
    non_members: tuple[np.ndarray, np.ndarray]
    source: str
    canaries: bool = False
