"""Embedding encryption with a secret key (encrypted-ViT paper, Sec. III-B and III-D, eqs. 2–7 and 13–14).

Only the patch embedding (``patch_embed.proj.weight``) and the position embedding (``pos_embed``) are
encrypted; every other parameter stays plain. The same linear maps encrypt weights and gradients, so the
server's mean (eqs. 9–12) commutes with them and it can aggregate without the key.

Layouts (timm): ``patch_embed.proj.weight`` is [D, C, P, P]. The paper's E_pat ∈ R^{L×D}, L = P²C, is its
transpose after flattening each filter in (channel, row, column) order — the order in which the convolution
reads a patch — so E_pat = W.reshape(D, L).T. ``pos_embed`` is [1, N+1, D] with the class-token row first.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.numpy import load_file
from torch import nn

from fedvit.clients.state import state_root
from fedvit.core.model import build_model
from fedvit.core.params import ENCRYPTED, PATCH_EMBED_WEIGHT, POS_EMBED
from fedvit.core.results import atomic_save_safetensors

NODE_CONFIG_KEY = "encryption-key"  # deployment: --node-config "encryption-key=<path>"
KEY_ENV = "FEDVIT_ENCRYPTION_KEY"  # or a path in the clients' environment
DEFAULT_KEY_NAME = "encryption-key.safetensors"  # else this file in the client state folder (`fedvit keygen`)
KEY_FORMAT = "fedvit-encryption-key/1"
# Generated keys are orthogonal (condition number 1 up to rounding); a loaded key must not exceed this bound,
# since decryption amplifies the float32 rounding of the aggregate by up to cond(E_a).
MAX_CONDITION = 100.0


class EncryptionKeyError(ValueError):
    """A key is missing, malformed, ill-conditioned or made for another model shape."""


@dataclass(frozen=True, eq=False)
class EncryptionKey:
    """The clients' shared secret: E_a (eq. 2), E_b as a row permutation (eqs. 4–6), a private-init seed.

    ``perm`` holds E_b's action on rows: (E_b X)[i] = X[perm[i]], with perm[0] = 0 (the class-token row
    stays in place) and perm[1:] the paper's l_e (eq. 4), 1-based over the patch rows.
    """

    e_a: np.ndarray  # float64 [L, L], invertible
    perm: np.ndarray  # int64 [N + 1]
    init_seed: int  # seeds the private initial embeddings (private-init mode)

    def __post_init__(self) -> None:
        L, n1 = self.e_a.shape[0], self.perm.shape[0]
        if self.e_a.shape != (L, L) or self.perm.ndim != 1 or n1 < 2:
            raise EncryptionKeyError(f"malformed key: E_a {self.e_a.shape}, permutation {self.perm.shape}")
        if self.perm[0] != 0 or not np.array_equal(np.sort(self.perm), np.arange(n1)):
            raise EncryptionKeyError("malformed key: E_b must permute the patch rows and keep the class row 0")
        cond = np.linalg.cond(self.e_a)
        if not cond <= MAX_CONDITION:
            raise EncryptionKeyError(f"E_a has condition number {cond:.3g} > {MAX_CONDITION:g}")
        object.__setattr__(self, "_e_a_inv", np.linalg.inv(self.e_a))
        object.__setattr__(self, "_perm_inv", np.argsort(self.perm))

    @property
    def patch_dim(self) -> int:
        """L = P²C."""
        return self.e_a.shape[0]

    @property
    def num_patches(self) -> int:
        """N."""
        return self.perm.shape[0] - 1

    @property
    def e_b(self) -> np.ndarray:
        """E_b as the (N+1)×(N+1) matrix of eq. 6 (for checks; encryption uses the permutation)."""
        return np.eye(self.perm.shape[0])[self.perm]

    @classmethod
    def generate(cls, patch_dim: int, num_patches: int, seed: int | None = None) -> EncryptionKey:
        """A new key for L = ``patch_dim`` and N = ``num_patches`` from ``seed`` (default: 128 fresh random bits).

        E_a is a Haar-random orthogonal matrix (QR of a Gaussian matrix with the signs of R's diagonal
        folded in): invertible with condition number 1, so decryption adds no error beyond float rounding.
        """
        rng = np.random.default_rng(secrets.randbits(128) if seed is None else seed)
        q, r = np.linalg.qr(rng.standard_normal((patch_dim, patch_dim)))
        e_a = q * np.sign(np.diag(r))
        perm = np.concatenate([[0], 1 + rng.permutation(num_patches)])
        return cls(e_a, perm.astype(np.int64), int(rng.integers(2**63 - 1)))

    # ------------------------------------------------------------------ model shape

    def check_shapes(self, shapes: dict[str, tuple[int, ...]]) -> None:
        """Raise :class:`EncryptionKeyError` unless the key fits these parameter shapes."""
        self.check_dims(*embedding_dims(shapes))

    def check_dims(self, L: int, n1: int) -> None:
        """Raise :class:`EncryptionKeyError` unless the key is for L = P²C and N + 1 = ``n1`` position rows."""
        if (L, n1 - 1) != (self.patch_dim, self.num_patches):
            raise EncryptionKeyError(
                f"the key is for L={self.patch_dim}, N={self.num_patches}; the model has L={L}, N={n1 - 1} "
                "(generate one for this model with `fedvit keygen`)"
            )

    # ------------------------------------------------------------------ encrypt / decrypt

    def encrypt(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Ê_pat = E_a E_pat (eq. 3), Ê_pos = E_b E_pos (eq. 7); other arrays pass through (weights or gradients)."""
        return self._apply(arrays, self.e_a, self.perm)

    def decrypt(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """E_pat = E_a⁻¹ Ê_pat (eq. 13), E_pos = E_b⁻¹ Ê_pos (eq. 14); other arrays pass through."""
        return self._apply(arrays, self._e_a_inv, self._perm_inv)

    def encrypt_masks(self, masks: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Move binary masks (shaped or flat) with their entries: E_b permutes the position rows.

        The patch-embedding mask must keep every entry: E_a mixes the rows, so no per-entry mask survives it.
        """
        if PATCH_EMBED_WEIGHT in masks and not masks[PATCH_EMBED_WEIGHT].all():
            raise EncryptionKeyError("E_a mixes the patch-embedding rows: its gradient cannot be masked")
        out = dict(masks)
        if POS_EMBED in out:
            mask = out[POS_EMBED]
            out[POS_EMBED] = mask.reshape(1, len(self.perm), -1)[:, self.perm].reshape(mask.shape)
        return out

    def _apply(self, arrays: dict[str, np.ndarray], matrix: np.ndarray, perm: np.ndarray) -> dict[str, np.ndarray]:
        self.check_shapes({name: arrays[name].shape for name in ENCRYPTED if name in arrays})
        out = dict(arrays)
        if PATCH_EMBED_WEIGHT in out:
            w = out[PATCH_EMBED_WEIGHT]
            flat = w.reshape(w.shape[0], -1).astype(np.float64)  # = E_patᵀ; E E_pat = (E_patᵀ Eᵀ)ᵀ
            out[PATCH_EMBED_WEIGHT] = (flat @ matrix.T).astype(w.dtype).reshape(w.shape)
        if POS_EMBED in out:
            out[POS_EMBED] = np.ascontiguousarray(out[POS_EMBED][:, perm])
        return out

    # ------------------------------------------------------------------ private initialisation

    def private_initial_embeddings(self, shapes: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
        """Plaintext initial embeddings drawn from the shared secret, with timm's initialisers for a new model.

        The patch filters get ``nn.Conv2d``'s default (Kaiming-uniform, a = √5), the position table a
        truncated normal with std 0.02 (timm's ``pos_embed`` init). All clients draw the same values.
        """
        self.check_shapes(shapes)
        g = torch.Generator().manual_seed(self.init_seed)
        patch = torch.empty(shapes[PATCH_EMBED_WEIGHT], dtype=torch.float32)
        nn.init.kaiming_uniform_(patch, a=math.sqrt(5), generator=g)
        pos = torch.empty(shapes[POS_EMBED], dtype=torch.float32)
        nn.init.trunc_normal_(pos, std=0.02, generator=g)
        return {PATCH_EMBED_WEIGHT: patch.numpy(), POS_EMBED: pos.numpy()}

    # ------------------------------------------------------------------ key files

    def save(self, path: Path) -> None:
        """Write the key file (owner-only permissions, atomic)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        arrays = {"e_a": self.e_a, "perm": self.perm, "init_seed": np.array([self.init_seed], dtype=np.int64)}
        meta = {"format": KEY_FORMAT, "patch-dim": str(self.patch_dim), "num-patches": str(self.num_patches)}
        atomic_save_safetensors(path, arrays, metadata=meta, mode=0o600)

    @classmethod
    def load(cls, path: Path) -> EncryptionKey:
        """Read a key file written by :meth:`save`; raises :class:`EncryptionKeyError` when it is not one."""
        return _load_cached(str(Path(path).expanduser().resolve()), _mtime(path))


def _mtime(path: Path) -> float:
    try:
        return os.stat(Path(path).expanduser()).st_mtime
    except OSError as err:
        raise EncryptionKeyError(f"cannot read the key file {path}: {err.strerror}") from None


@functools.lru_cache(maxsize=4)
def _load_cached(path: str, _mtime: float) -> EncryptionKey:
    try:
        with safe_open(path, framework="numpy") as f:
            meta = f.metadata() or {}
            if meta.get("format") != KEY_FORMAT:
                raise EncryptionKeyError(f"{path} is not a fedvit key file (format {meta.get('format')!r})")
            return EncryptionKey(f.get_tensor("e_a"), f.get_tensor("perm"), int(f.get_tensor("init_seed")[0]))
    except (OSError, KeyError) as err:  # safetensors raises these for unreadable or incomplete files
        raise EncryptionKeyError(f"cannot read the key file {path}: {err}") from None


def embedding_dims(shapes: dict[str, tuple[int, ...]]) -> tuple[int, int]:
    """(L, N+1) from the shapes of ``patch_embed.proj.weight`` [D, C, P, P] and ``pos_embed`` [1, N+1, D]."""
    missing = [name for name in ENCRYPTED if name not in shapes]
    if missing:
        raise EncryptionKeyError(f"the model has no {missing}: embedding encryption needs a timm ViT")
    patch, pos = shapes[PATCH_EMBED_WEIGHT], shapes[POS_EMBED]
    return int(np.prod(patch[1:])), int(pos[1])


def model_embedding_dims(model: nn.Module) -> tuple[int, int]:
    """(L, N+1) of a timm ViT; refuses models whose position table has no class-token row (E_b keeps it)."""
    shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
    L, n1 = embedding_dims(shapes)
    num_patches = int(model.patch_embed.num_patches)
    if n1 != num_patches + 1:
        raise EncryptionKeyError(
            f"pos_embed has {n1} rows for {num_patches} patches: the paper's E_b needs a class-token row first"
        )
    return L, n1


def default_key_path() -> Path:
    """Where ``fedvit keygen`` writes and clients look last: the client state folder."""
    return state_root() / DEFAULT_KEY_NAME


def client_key_path(node_config: dict) -> Path | None:
    """Where this client's key is, looked up on the client side only, first match wins.

    Node config ``encryption-key`` (deployment), ``$FEDVIT_ENCRYPTION_KEY``, then :func:`default_key_path`
    (simulation: an environment variable only reaches the clients if it was set when the SuperLink started).
    """
    path = node_config.get(NODE_CONFIG_KEY) or os.environ.get(KEY_ENV)
    if path:
        return Path(str(path))
    return default_key_path() if default_key_path().exists() else None


def client_key(node_config: dict) -> EncryptionKey | None:
    """This client's key (see :func:`client_key_path`), or None when it has none."""
    path = client_key_path(node_config)
    return EncryptionKey.load(path) if path is not None else None


def require_client_key(node_config: dict) -> EncryptionKey:
    """:func:`client_key`, or a clear error saying where the key must come from."""
    key = client_key(node_config)
    if key is None:
        raise EncryptionKeyError(
            f"encryption is on but this client has no key: create {default_key_path()} with `fedvit keygen`, "
            f"or set --node-config '{NODE_CONFIG_KEY}=<key file>' or ${KEY_ENV}"
        )
    return key


def keygen(model_config, out: Path | None = None, seed: int | None = None, force: bool = False) -> Path:
    """Write a new key file for ``model_config``'s embedding shapes; refuses to overwrite unless ``force``."""
    out = Path(out).expanduser() if out is not None else default_key_path()
    if out.exists() and not force:
        raise EncryptionKeyError(f"{out} exists; pass --force to replace it (runs encrypted with it become unreadable)")
    patch_dim, n1 = config_embedding_dims(model_config)
    EncryptionKey.generate(patch_dim, n1 - 1, seed).save(out)
    return out


def config_embedding_dims(model_config) -> tuple[int, int]:
    """(L, N+1) of the model a config builds (the skeleton only: no pretrained weights are fetched)."""
    return model_embedding_dims(build_model(dataclasses.replace(model_config, pretrained="off"), num_classes=2))


def decrypt_file(src: Path, key: EncryptionKey, out: Path) -> Path:
    """Decrypt a saved global model (``model.safetensors`` or a checkpoint; strategy state is dropped)."""
    arrays = {k: v for k, v in load_file(str(src)).items() if not k.startswith("strategy/")}
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_save_safetensors(out, key.decrypt(arrays))
    return out


def ensure_client_key(model_config) -> Path:
    """The key a simulation's clients will use, created by :func:`keygen` when there is none; checked to fit."""
    path = client_key_path({})
    if path is None:
        path = keygen(model_config)
        print(f"created the clients' encryption key {path}", flush=True)
        return path
    EncryptionKey.load(path).check_dims(*config_embedding_dims(model_config))
    return path
