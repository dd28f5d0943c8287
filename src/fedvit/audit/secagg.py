"""Secure aggregation (Flower's SecAgg+) read from captures: each round's four stages per node gathered into one
protocol round, and the aggregate rebuilt as the server rebuilds it, with Flower's own SecAgg+ primitives.

What each observer of a SecAgg+ round holds (Bell et al., "Secure Single-Server Aggregation with (Poly)Logarithmic
Complexity", CCS 2020; Flower's ``SecAggPlusWorkflow``):

- per client, a masked vector: uniform modulo the ring unless the masks are known, so nothing on its own;
- the broadcast models, in clear: under FedAvg each one after the first is the previous round's aggregate;
- the unmask stage's shares, sent to the server in plaintext inside the message (only TLS protects the link):
  whoever holds them and the masked vectors rebuilds the aggregate exactly as the server does (:func:`rebuild`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
from typing import Any

import numpy as np

from fedvit.audit.json_fields import flattened
from fedvit.capture.reader import SECAGG_RECORD, Exchange
from fedvit.core.secagg import ARRAY_NAMES

SETUP, SHARE_KEYS, COLLECT, UNMASK = "setup", "share_keys", "collect_masked_vectors", "unmask"
FITINS = "fitins.parameters"  # the legacy API's instruction arrays: the broadcast model, in clear
FITINS_CONFIG = "fitins.config"  # the legacy API's instruction config
AGGREGATE = "aggregate"  # the node of a round's aggregate, audited as one update (the server's view)


@dataclasses.dataclass
class SecAggRound:
    """One SecAgg+ round of one run as the captures show it (per node: its exchange of each stage)."""

    run_id: Any
    round: int
    stages: dict[int, dict[str, Exchange]]  # node -> stage -> exchange

    @property
    def sampled(self) -> list[int]:
        """The nodes the server sent the setup to."""
        return sorted(n for n, s in self.stages.items() if SETUP in s)

    @property
    def settings(self) -> dict[str, Any]:
        """The setup's parameters (sample and share numbers, threshold, clipping, quantisation and modulus ranges)."""
        first = next(s[SETUP] for s in self.stages.values() if SETUP in s)
        return {k: v for k, v in first.received_configs[SECAGG_RECORD].items() if k != "stage"}

    def replied(self, stage: str) -> list[int]:
        """The nodes whose reply to ``stage`` was captured and is not an error."""
        return sorted(n for n, s in self.stages.items() if stage in s and SECAGG_RECORD in s[stage].sent_configs)

    @property
    def broadcast(self) -> list[np.ndarray] | None:
        """The model the server sent with the collect stage (the legacy API's ``fitins.parameters``), in order."""
        for node in sorted(self.stages):
            ex = self.stages[node].get(COLLECT)
            if ex is not None and FITINS in ex.received_records:
                arrays = ex.received_records[FITINS]
                return [arrays[k] for k in sorted(arrays, key=int)]
        return None

    @property
    def examples(self) -> dict[int, int]:
        """Each node's number of training examples, from its collect reply's metrics (the legacy ``FitRes``)."""
        out = {}
        for node in self.replied(COLLECT):
            metrics = self.stages[node][COLLECT].sent_metrics
            if "num_examples" in metrics:
                out[node] = int(metrics["num_examples"])
        return out

    @property
    def label(self) -> str:
        return f"run {self.run_id} round {self.round}"


def secagg_rounds(exchanges: list[Exchange]) -> tuple[list[SecAggRound], list[Exchange]]:
    """The SecAgg+ rounds among ``exchanges`` (by run and round) and the exchanges of no SecAgg+ round."""
    rounds: dict[tuple[Any, int], SecAggRound] = {}
    rest = []
    for ex in exchanges:
        stage = ex.secagg_stage
        if stage is None:
            rest.append(ex)
            continue
        key = (ex.run_id, ex.round)
        found = rounds.setdefault(key, SecAggRound(ex.run_id, ex.round, {}))
        found.stages.setdefault(int(ex.node), {})[stage] = ex
    return [rounds[k] for k in sorted(rounds, key=lambda k: (str(k[0]), k[1]))], rest


def neighbours(found: SecAggRound) -> dict[int, set[int]]:
    """Each sampled node's neighbours (itself included): the nodes whose public keys its share-keys stage carried,
    and those whose share-keys stage carried its own (the relation is symmetric)."""
    out = {n: {n} for n in found.sampled}
    for node, stages in found.stages.items():
        if SHARE_KEYS in stages:
            keys = [int(k) for k in stages[SHARE_KEYS].received_configs[SECAGG_RECORD] if k.isdigit()]
            for other in keys:
                out.setdefault(node, {node}).add(other)
                out.setdefault(other, {other}).add(node)
    return out


def public_key_1(found: SecAggRound, node: int) -> bytes | None:
    """A node's first public key: from its setup reply, else from a share-keys stage that forwarded it."""
    setup = found.stages.get(node, {}).get(SETUP)
    if setup is not None and "pk1" in setup.sent_configs.get(SECAGG_RECORD, {}):
        return setup.sent_configs[SECAGG_RECORD]["pk1"]
    for stages in found.stages.values():
        if SHARE_KEYS in stages and str(node) in stages[SHARE_KEYS].received_configs[SECAGG_RECORD]:
            return stages[SHARE_KEYS].received_configs[SECAGG_RECORD][str(node)][0]
    return None


class NotRebuilt(ValueError):
    """The captures do not hold what the server needs to rebuild this round's aggregate (the reason)."""


def rebuild(found: SecAggRound) -> list[np.ndarray]:
    """The round's aggregate from the captured masked vectors and the unmask stage's shares, computed as Flower's
    ``SecAggPlusWorkflow.unmask_stage`` computes it, with Flower's primitives: the masked vectors summed modulo the
    ring; each surviving node's self-mask seed, and each dropped node's secret key, recombined from its Shamir
    shares (at least the threshold); the self-masks and the dropped nodes' pairwise masks removed; the weight factor
    extracted; dequantised, shifted by the clipping offset and divided by the total weight. Raises
    :class:`NotRebuilt` with what is missing."""
    from flwr.common import bytes_to_ndarray
    from flwr.common.secure_aggregation.crypto.shamir import combine_shares
    from flwr.common.secure_aggregation.crypto.symmetric_encryption import generate_shared_key
    from flwr.common.secure_aggregation.ndarrays_arithmetic import (
        factor_extract,
        get_parameters_shape,
        parameters_addition,
        parameters_mod,
        parameters_subtraction,
    )
    from flwr.common.secure_aggregation.quantization import dequantize
    from flwr.common.secure_aggregation.secaggplus_utils import pseudo_rand_gen
    from flwr.supercore.primitives.asymmetric import bytes_to_private_key, bytes_to_public_key

    settings = found.settings
    mod_range, threshold = int(settings["mod_range"]), int(settings["threshold"])
    active = found.replied(COLLECT)
    if not active:
        raise NotRebuilt("no masked vector was captured")
    masked = None
    for node in active:
        vector = [bytes_to_ndarray(b) for b in found.stages[node][COLLECT].sent_configs[SECAGG_RECORD]["masked_params"]]
        masked = vector if masked is None else parameters_addition(masked, vector)
    masked = parameters_mod(masked, mod_range)
    shares: dict[int, list[bytes]] = {node: [] for node in found.sampled}
    for node in found.replied(UNMASK):
        reply = found.stages[node][UNMASK].sent_configs[SECAGG_RECORD]
        for owner, share in zip(reply["nids"], reply["shares"], strict=True):
            shares.setdefault(int(owner), []).append(share)
    near = neighbours(found)
    shape = get_parameters_shape(masked)
    for node, held in shares.items():
        if len(held) < threshold:
            raise NotRebuilt(f"node {node}: {len(held)} share(s) captured, the threshold is {threshold}")
        secret = combine_shares(held)
        if node in active:  # its self-mask, seeded by its private mask seed
            masked = parameters_subtraction(masked, pseudo_rand_gen(secret, mod_range, shape))
            continue
        for other in sorted(near.get(node, set()) - {node}):  # a dropped node: its pairwise masks, from its key
            key = public_key_1(found, other)
            if key is None:
                raise NotRebuilt(f"node {other}'s public key was not captured")
            pairwise = pseudo_rand_gen(generate_shared_key(bytes_to_private_key(secret), bytes_to_public_key(key)),
                                       mod_range, shape)  # fmt: skip
            masked = parameters_addition(masked, pairwise) if node > other else parameters_subtraction(masked, pairwise)
    total_ratio, values = factor_extract(parameters_mod(masked, mod_range))
    quantisation, clipping = int(settings["target_range"]), float(settings["clipping_range"])
    aggregate = dequantize(values, clipping, quantisation)
    offset = -(len(active) - 1) * clipping
    return [(vector + offset) * (quantisation / total_ratio) for vector in aggregate]


TLS = ("TLS on the clients' links hides every message from a wire eavesdropper (only connection times and sizes "
       "remain); the server still holds the aggregate")  # fmt: skip
OBSERVERS = (
    "per client: a masked vector, uniform modulo the ring on its own, so no per-client figure is computed from it; "
    "the broadcast models travel in clear (under FedAvg each one after the first is the previous aggregate); the "
    "unmask stage's shares travel to the server in plaintext inside the message, so the server, and anyone on its "
    "links without TLS, rebuilds the aggregate"
)


@dataclasses.dataclass(frozen=True)
class BroadcastGap:
    """A rebuilt aggregate against the next round's broadcast (:func:`gap_to_broadcast`)."""

    next_broadcast_max_difference: float | None  # the largest absolute difference of an entry (None: shapes differ)
    next_broadcast_rms_difference: float | None = None  # the RMS of their difference per entry
    aggregate_rms: float | None = None
    central_dp_std: float | None = None  # the std per entry the app's central DP adds (None: no central DP)


@dataclasses.dataclass(frozen=True)
class RoundEntry:
    """What the report says of one SecAgg+ round (:func:`describe_rounds`)."""

    round: str
    sampled: list[int]
    survived: list[int]  # the nodes that sent a masked vector
    dropped: list[int]
    settings: dict[str, Any]  # the setup's parameters (:attr:`SecAggRound.settings`)
    examples: dict[int, int]
    aggregate: str  # how the aggregate was obtained, or why not
    gap: BroadcastGap | None = flattened(BroadcastGap)
    not_rebuilt: str | None = None  # why the masked vectors were not unmasked


@dataclasses.dataclass(frozen=True)
class SecureAggregation:
    """The report's secure-aggregation section: the protocol, what each observer holds, and each round."""

    rounds: list[RoundEntry]
    protocol: str = "SecAgg+ (Flower's SecAggPlusWorkflow and secaggplus_mod)"
    observers: str = OBSERVERS
    tls: str = TLS


def describe_rounds(rounds: list[SecAggRound], noise_std: float | None = None
                    ) -> tuple[list[RoundEntry], dict[tuple[Any, int], list[np.ndarray]]]:  # fmt: skip
    """Per SecAgg+ round, what the report says of it (nodes sampled and surviving, the protocol's settings, whether
    and how the aggregate was obtained, its gap to the next broadcast against ``noise_std``, the std per entry of
    the app's central-DP noise where its code sets one), and the aggregates obtained: rebuilt from the captures,
    else taken from the next round's broadcast (FedAvg)."""
    entries, aggregates = [], {}
    by_key = {(r.run_id, r.round): r for r in rounds}
    for found in rounds:
        following = by_key.get((found.run_id, found.round + 1))
        after = following.broadcast if following is not None else None
        entry = functools.partial(RoundEntry, found.label, found.sampled, found.replied(COLLECT),
                                  sorted(set(found.sampled) - set(found.replied(COLLECT))), found.settings,
                                  found.examples)  # fmt: skip
        try:
            rebuilt = rebuild(found)
            gap = None if after is None else gap_to_broadcast(rebuilt, after, noise_std)
            entries.append(entry("rebuilt from the masked vectors and the unmask stage's shares (Flower's "
                                 "primitives)", gap))  # fmt: skip
            aggregates[(found.run_id, found.round)] = rebuilt
        except NotRebuilt as err:
            if after is not None:
                entries.append(entry("the next round's broadcast (FedAvg sends the aggregate on)", None, str(err)))
                aggregates[(found.run_id, found.round)] = after
            else:
                entries.append(entry("not obtained: " + str(err), None, str(err)))
    return entries, aggregates


EQUAL_RELATIVE = 1e-3  # an RMS gap below this share of the aggregate's RMS: SecAgg+'s quantisation, "equal"


def gap_to_broadcast(rebuilt: list[np.ndarray], after: list[np.ndarray], noise_std: float | None) -> BroadcastGap:
    """The rebuilt aggregate against the next round's broadcast: the largest absolute difference of an entry and the
    RMS of their difference per entry, the aggregate's own RMS, and the std the app's central DP would add
    (``noise_std``, None: no central DP in the code); where the shapes differ, only the largest difference, None."""
    if len(rebuilt) != len(after) or any(a.shape != b.shape for a, b in zip(rebuilt, after, strict=True)):
        return BroadcastGap(None)
    diff = np.concatenate([(np.asarray(b, np.float64) - np.asarray(a, np.float64)).ravel()
                           for a, b in zip(rebuilt, after, strict=True)])  # fmt: skip
    scale = np.concatenate([np.asarray(a, np.float64).ravel() for a in rebuilt])
    return BroadcastGap(float(np.max(np.abs(diff))) if diff.size else 0.0,
                        float(np.sqrt(np.mean(diff**2))) if diff.size else 0.0,
                        float(np.sqrt(np.mean(scale**2))) if scale.size else 0.0, noise_std)  # fmt: skip


def gap_text(gap: BroadcastGap | None) -> str:
    """How the report states a rebuilt aggregate's gap to the next broadcast: equal (SecAgg+'s quantisation), the
    server's central-DP noise beside its expected size, or a change the server made that the audit cannot name."""
    if gap is None:
        return ""
    rms, scale, std = gap.next_broadcast_rms_difference, gap.aggregate_rms, gap.central_dp_std
    largest = gap.next_broadcast_max_difference
    if rms is None:
        return "" if largest is None else f"; it equals the next round's broadcast to {largest:.1e}"
    if std is not None:
        return (f"; the next round's broadcast differs from it by {rms:.3g} RMS per entry (max {largest:.2g}): the "
                f"server's central-DP noise, of expected std σ·C/N = {std:.3g} ({rms / std:.2f}× that)"
                if std > 0 else f"; the next round's broadcast differs from it by {rms:.3g} RMS per entry")
    if rms <= EQUAL_RELATIVE * max(scale, 1e-30):
        return f"; it equals the next round's broadcast to {largest:.1e} (RMS {rms:.1e}: SecAgg+'s quantisation)"
    return (f"; the next round's broadcast differs from it by {rms:.3g} RMS per entry ({rms / max(scale, 1e-30):.1%} "
            "of its RMS): the server changed the aggregate before sending it on (noise, a server optimiser), and "
            "the app's code read names no central DP")


def aggregate_exchange(found: SecAggRound, aggregate: list[np.ndarray]) -> Exchange:
    """The server's view of one SecAgg+ round as one update: the broadcast model received, the aggregate sent back,
    all survivors' examples; its node is ``aggregate`` and its members the surviving nodes (what the audit scores
    against, with ``--data``). A fedvit run's instruction names the legacy API's arrays: they are named so (its
    reply record is then fedvit's ``arrays``)."""
    survivors = found.replied(COLLECT)
    collect = found.stages[survivors[0]][COLLECT]
    broadcast = found.broadcast
    if broadcast is None:
        raise NotRebuilt("the broadcast model was not captured")
    named = array_names(collect)
    names = named or [str(i) for i in range(len(broadcast))]
    if len(names) != len(broadcast):
        raise NotRebuilt(f"the instruction names {len(names)} arrays, the broadcast model has {len(broadcast)}")
    received = dict(zip(names, broadcast, strict=True))
    sent = {n: np.asarray(a, b.dtype) for n, a, b in zip(names, aggregate, broadcast, strict=True)}
    examples = sum(found.examples.values())
    return dataclasses.replace(
        collect,
        node=AGGREGATE,
        partition=None,
        received=received,
        sent=sent,
        sent_metrics={"num-examples": examples} if examples else {},
        received_records={"arrays" if named is not None else FITINS: received},
        sent_records={"arrays": sent} if named is not None else {},
        meta=dict(collect.meta) | {"secure-aggregation": f"the aggregate of {len(survivors)} clients",
                                   "member-partitions": {str(n): found.stages[n][COLLECT].partition
                                                         for n in survivors},
                                   "member-examples": {str(n): found.examples[n] for n in survivors
                                                       if n in found.examples}},  # fmt: skip
        members=tuple(survivors),
    )


def array_names(collect: Exchange) -> list[str] | None:
    """The model's array names a fedvit SecAgg+ instruction carries in its legacy config, or None (another app)."""
    names = collect.received_configs.get(FITINS_CONFIG, {}).get(ARRAY_NAMES)
    return json.loads(names) if isinstance(names, str) else None
