"""Encrypted-domain aggregation (encrypted-ViT paper, Sec. III-A and III-C, eqs. 8–12): the server has no key.

The server's update is linear in the clients' updates (the mean of eq. 8, FedAvg's weighted mean, and
eq. 12's per-entry mean under a permutation), so applying it to Ê_pat = E_a E_pat and Ê_pos = E_b E_pos
gives E_a and E_b times the plain result (eqs. 11–12). The strategy therefore aggregates exactly as its
plain parent does; what it adds is the setup handshake that puts the global model in the encrypted domain.
"""

from __future__ import annotations

from logging import INFO, WARNING

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from fedvit.core.params import ENCRYPTED, PATCH_EMBED_WEIGHT
from fedvit.strategies.base import FedVitStrategy, error_summary
from fedvit.strategies.fedavg import FedAvg
from fedvit.strategies.fedsgd import FedSGD
from fedvit.strategies.fedwavg import FedWAvg
from fedvit.strategies.masked_fedsgd import MaskedFedSGD

STATE_PUBLIC = "encryption/public/"  # the plaintext initial layers the server sent (it knew them anyway)
STATE_AGREED = "encryption/agreed/"  # their encryption, as all clients returned it
AGREEMENT_RTOL = 1e-5  # same key on different hardware may differ in the last float32 bits; other keys differ by O(1)


class KeyHandshakeError(RuntimeError):
    """Clients failed the setup handshake or hold different keys: aggregating them would mix key domains."""


def group_by_agreement(answers: dict[int, dict[str, np.ndarray]]) -> list[list[int]]:
    """Partition ids grouped by identical (within rounding) encryptions, largest group first."""
    groups: list[list[int]] = []
    for pid in sorted(answers):
        for group in groups:
            if _same(answers[group[0]], answers[pid]):
                group.append(pid)
                break
        else:
            groups.append([pid])
    return sorted(groups, key=len, reverse=True)


def _same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return all(np.max(np.abs(a[n] - b[n])) <= AGREEMENT_RTOL * max(np.max(np.abs(b[n])), 1e-30) for n in ENCRYPTED)


def known_plaintext_exposure(patch_shape: tuple[int, ...]) -> str:
    """What a server holding the plaintext initial embeddings and their encryption can derive."""
    d, patch_dim = patch_shape[0], int(np.prod(patch_shape[1:]))
    e_a = (
        f"and E_a exactly by least squares (L={patch_dim} <= D={d})"
        if patch_dim <= d
        else f"and E_a only as a minimum-norm estimate (L={patch_dim} > D={d})"
    )
    return f"this server knows a plaintext/ciphertext pair of the embeddings: E_b follows exactly, {e_a}; " + (
        "use encryption.mode='private-init' to avoid it"
    )


class EncryptedAggregation(FedVitStrategy):
    """Adds the key handshake to a plain strategy; aggregation is the parent's, on ciphertexts."""

    def __init__(self, *, encryption_mode: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.encryption_mode = encryption_mode
        self.public: dict[str, np.ndarray] = {}
        self.agreed: dict[str, np.ndarray] = {}
        self.verified: set[int] = set()  # node ids whose key matched

    def prepare_initial(self, grid: Grid, arrays: ArrayRecord, resumed: bool = False) -> ArrayRecord:
        """Setup handshake: every client encrypts the initial embeddings; they must agree; the server adopts them.

        In "paper" mode the clients encrypt the public layers sent here; in "private-init" mode they encrypt
        layers drawn from the shared secret. A resumed run re-checks the clients against the stored answer.
        """
        if not resumed:
            self.public = {name: arrays[name].numpy() for name in ENCRYPTED}
        elif not self.agreed:
            raise KeyHandshakeError("the checkpoint holds no handshake record: cannot verify the clients' keys")
        nodes = self.discover(grid)  # after a resume this already checks every node against the stored answer
        if resumed:
            return arrays
        self.verify(grid, sorted(nodes))
        adopted = ArrayRecord(
            {name: Array(self.agreed[name]) if name in ENCRYPTED else a for name, a in arrays.items()}
        )
        log(
            INFO,
            "encryption (%s): %d client(s) agree on the key; global model adopted",
            self.encryption_mode,
            len(self.verified),
        )
        if self.encryption_mode == "paper":
            log(WARNING, "encryption (paper): %s", known_plaintext_exposure(self.public[PATCH_EMBED_WEIGHT].shape))
        return adopted

    def discover(self, grid: Grid) -> dict[int, int]:
        """Nodes that join after setup must pass the same handshake before they are sampled."""
        available = super().discover(grid)
        if self.agreed:
            new = sorted(n for n in available if n not in self.verified)
            if new:
                self.verify(grid, new)
        return available

    def verify(self, grid: Grid, node_ids: list[int]) -> None:
        """Ask ``node_ids`` for their encryption of the public layers; raise if any fails or disagrees."""
        content = RecordDict(
            {
                "arrays": ArrayRecord({name: Array(v) for name, v in self.public.items()}),
                "config": ConfigRecord({"ask": "encrypt-initial"}),
            }
        )
        messages = [Message(content, dst_node_id=n, message_type=MessageType.QUERY) for n in node_ids]
        answers, failed = {}, {}
        for reply in grid.send_and_receive(messages, timeout=self.wait_timeout):
            pid = self.partition_of.get(reply.metadata.src_node_id, -reply.metadata.src_node_id)
            if reply.has_error():
                failed[pid] = error_summary(reply.error.reason)
                continue
            got = {name: a.numpy() for name, a in reply.content["arrays"].items()}
            if set(got) != set(ENCRYPTED) or any(got[n].shape != self.public[n].shape for n in ENCRYPTED):
                failed[pid] = "the handshake reply does not hold the two encrypted embedding arrays"
                continue
            answers[pid] = got
        silent = sorted({self.partition_of[n] for n in node_ids} - set(answers) - set(failed))
        failed |= dict.fromkeys(silent, "no handshake reply")
        if failed:
            pid, reason = min(failed.items())
            raise KeyHandshakeError(
                f"encryption handshake failed for partition(s) {sorted(failed)} (partition {pid}: {reason})"
            )
        if self.agreed:
            odd = sorted(pid for pid, answer in answers.items() if not _same(answer, self.agreed))
            agreeing = "the adopted global model"
        else:
            groups = group_by_agreement(answers)
            odd = sorted(pid for group in groups[1:] for pid in group)
            agreeing = f"partition(s) {groups[0]}"
            self.agreed = answers[groups[0][0]]
        if odd:
            raise KeyHandshakeError(
                f"partition(s) {odd} hold a different encryption key than {agreeing}; the run stops "
                "(aggregating them would mix key domains)"
            )
        self.verified |= set(node_ids)

    # ------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict[str, np.ndarray]:
        state = super().state_dict()
        state |= {STATE_PUBLIC + n: v for n, v in self.public.items()}
        return state | {STATE_AGREED + n: v for n, v in self.agreed.items()}

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        own = {k: v for k, v in state.items() if k.startswith("encryption/")}
        self.public = {k.removeprefix(STATE_PUBLIC): v for k, v in own.items() if k.startswith(STATE_PUBLIC)}
        self.agreed = {k.removeprefix(STATE_AGREED): v for k, v in own.items() if k.startswith(STATE_AGREED)}
        super().load_state_dict({k: v for k, v in state.items() if k not in own})


class EncryptedFedSGD(EncryptedAggregation, FedSGD):
    """FedSGD on encrypted gradients: Ŵ ← Ŵ − η · mean(Ĝ) (eqs. 9–12)."""


class EncryptedFedAvg(EncryptedAggregation, FedAvg):
    """FedAvg on encrypted weights: the weighted mean commutes with E_a and E_b as eq. 8's mean does."""


class EncryptedMaskedFedSGD(EncryptedAggregation, MaskedFedSGD):
    """Masked FedSGD (eq. 12) on encrypted gradients; exact because the patch embedding is never masked
    (checked in the config) and E_b only permutes the position rows, masks included."""


class EncryptedFedWAvg(EncryptedAggregation, FedWAvg):
    """FedWAvg on encrypted weights: the classifier head it compares is not encrypted, and its weighted mean
    commutes with E_a and E_b."""


ENCRYPTED_STRATEGIES: dict[str, type[EncryptedAggregation]] = {
    "fedsgd": EncryptedFedSGD,
    "fedavg": EncryptedFedAvg,
    "masked-fedsgd": EncryptedMaskedFedSGD,
    "fedwavg": EncryptedFedWAvg,
}
