"""Which partition each captured node trained on, where the capture does not say (a ``fedvit tap`` capture carries
no node config): each node's update is fitted against every candidate partition's data and the nodes are assigned
to partitions jointly (one partition per node, the assignment of the highest total fit).

The fit is the label fit: the head-bias part of an update is, to first order, the sum over the client's steps of
the batch-mean softmax minus the one-hot labels (the rule behind :mod:`fedvit.attacks.labels`), so the received
minus the sent bias (weights) or the bias gradient (FedSGD), centred over the classes, points opposite to the
partition's centred label histogram: the fit is their cosine, in [-1, 1]. A partition whose size is not the
``num-examples`` the node reported cannot be its partition. The match is refused as ambiguous where the best
assignment's total fit beats the runner-up's (the best assignment that moves any node) by less than
:data:`MATCH_MARGIN`: identical label histograms (IID partitions of equal size) tie exactly.

The membership score is not part of the fit: its loss drop follows the partitions' class mix, not their images,
after a few local steps (measured on four tapped nodes; the figures are in docs/audit.md). Both
``fedvit audit --data LOADER`` and ``fedvit audit-app`` match a capture's nodes here (:func:`with_matched_nodes`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np
from scipy.optimize import linear_sum_assignment

from fedvit.audit.user_data import UserData
from fedvit.capture.reader import AuditInputError, Exchange
from fedvit.observed.model_spec import ModelSpec, head_bias
from fedvit.observed.recipe import sent_kind

MATCH_MARGIN = 0.05  # cosine: the best assignment's total fit must beat the runner-up assignment's by this much
EXCLUDED = -10.0  # the fit of a partition whose size differs from the node's reported num-examples


@dataclasses.dataclass(frozen=True)
class NodeMatch:
    """One node's inferred partition, its fit, and the runner-up partition and its fit."""

    node: str
    partition: int
    fit: float
    runner_up: int | None
    runner_up_fit: float | None

    def described(self) -> str:
        other = "" if self.runner_up is None else f", runner-up partition {self.runner_up}: {self.runner_up_fit:.2f}"
        return f"{self.node} → {self.partition} (inferred, fit {self.fit:.2f}{other})"


def label_fit(update_bias: np.ndarray, labels: np.ndarray) -> float:
    """Cosine between the centred label histogram and the centred negative bias change (see the module docstring)."""
    histogram = np.bincount(labels, minlength=len(update_bias))[: len(update_bias)].astype(np.float64)
    a, b = -(update_bias - update_bias.mean()), histogram - histogram.mean()
    norm = float(np.linalg.norm(a) * np.linalg.norm(b))
    return float(a @ b / norm) if norm > 0 else 0.0


def bias_signal(ex: Exchange, bias: str) -> np.ndarray:
    """The node's head-bias update as a gradient direction: received − sent for weights, the sent gradient as is."""
    name = next((k for k in ex.sent if k == bias or k.endswith("/" + bias)), None)
    if name is None or name not in ex.received:
        raise AuditInputError(f"{ex.label}: its reply holds no {bias!r} (the head's bias) to match it to a partition")
    kind, _ = sent_kind(ex.received, ex.sent, [n for n in ex.sent if n in ex.received])
    sent, received = ex.sent[name].astype(np.float64), ex.received[name].astype(np.float64)
    return received - sent if kind != "gradient" else sent


def match_nodes(exchanges: Sequence[Exchange], bias: str, partitions: Sequence[int],
                load: Callable[[int], tuple[np.ndarray, np.ndarray]]) -> list[NodeMatch]:  # fmt: skip
    """Each node (its first exchange) matched to one of ``partitions`` (see the module docstring); an
    AuditInputError where there are fewer partitions than nodes or the match is ambiguous."""
    first: dict[str, Exchange] = {}
    for ex in sorted(exchanges, key=lambda e: e.round):
        first.setdefault(str(ex.node), ex)
    nodes = sorted(first)
    if len(partitions) < len(nodes):
        raise AuditInputError(f"{len(nodes)} nodes but only {len(partitions)} candidate partitions to match them to")
    data = {p: load(p)[1] for p in partitions}
    fits = np.empty((len(nodes), len(partitions)))
    for i, node in enumerate(nodes):
        signal = bias_signal(first[node], bias)
        examples = first[node].sent_metrics.get("num-examples")
        for j, p in enumerate(partitions):
            size_differs = isinstance(examples, int | float) and int(examples) != len(data[p])
            fits[i, j] = EXCLUDED if size_differs else label_fit(signal, data[p])
    rows, cols = linear_sum_assignment(fits, maximize=True)
    best = fits[rows, cols].sum()
    runner_up = -np.inf  # the best assignment that moves at least one node
    for i, j in zip(rows, cols, strict=True):
        forbidden = fits.copy()
        forbidden[i, j] = -1e9
        r, c = linear_sum_assignment(forbidden, maximize=True)
        runner_up = max(runner_up, forbidden[r, c].sum())
    matches = []
    for i, j in zip(rows, cols, strict=True):
        others = [(fits[i, k], partitions[k]) for k in range(len(partitions)) if k != j]
        second = max(others) if others else None
        matches.append(NodeMatch(nodes[i], partitions[j], float(fits[i, j]), None if second is None else second[1],
                                 None if second is None else float(second[0])))  # fmt: skip
    if len(partitions) > 1 and best - runner_up < MATCH_MARGIN:
        listed = "; ".join(m.described() for m in matches)
        raise AuditInputError(f"the nodes cannot be told apart by their updates (the best assignment beats the "
                              f"runner-up by {best - runner_up:.3f} in label fit, under {MATCH_MARGIN}: {listed}); "
                              "give --partition NODE=PARTITION")  # fmt: skip
    return matches


def with_matched_nodes(exchanges: Sequence[Exchange], data: UserData | None,
                       spec: ModelSpec | None) -> tuple[UserData | None, str | None]:  # fmt: skip
    """``data`` with every node the capture and ``--partition`` leave unmapped matched to a partition of the loader
    (:func:`match_nodes`), and the report's note saying so; ``data`` as is (note None) where nothing is unmapped,
    the data is a dataset name (its nodes record their partition), or no model (``spec``: ``--model``) with a
    classifier bias is known (the audit then notes each unmapped node as unscored). The candidates are partitions
    0 to P − 1 (P: ``--num-partitions``, else the capture's node count) other than the decoy partitions and those
    mapped to other nodes; an AuditInputError where the match is ambiguous."""
    if data is None or data.named or spec is None:
        return data, None
    nodes = {str(ex.node) for ex in exchanges if not ex.members}
    mapped = {str(ex.node): ex.partition for ex in exchanges if not ex.members and ex.partition is not None}
    mapped |= {n: p for n, p in data.partitions.items() if n in nodes}
    unmapped = [ex for ex in exchanges if not ex.members and str(ex.node) not in mapped]
    bias = head_bias(spec.build()) if unmapped else None
    if bias is None:
        return data, None
    count = data.num_partitions or len(nodes)
    taken = set(data.decoy_partitions) | {int(p) for p in mapped.values()}
    candidates = [p for p in range(count) if p not in taken]
    matches = match_nodes(unmapped, bias, candidates, data.load)
    matched = dataclasses.replace(data, partitions=data.partitions | {m.node: m.partition for m in matches})
    counted = "--num-partitions" if data.num_partitions else "the capture's node count"
    note = (f"node → partition inferred from each update's label fit to partitions {candidates[0]}–{candidates[-1]} "
            f"of --data ({count} partitions: {counted}; give --partition NODE=ID to state it): "
            + "; ".join(m.described() for m in matches))  # fmt: skip
    return matched, note
