"""Embedding encryption (encrypted-ViT paper): keys, eqs. 3/7/13/14, the handshake, and plain-equivalent runs."""

import json
import os
import stat

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from fedvit.clients import runner
from fedvit.clients.encryption import (
    ENCRYPTED,
    KEY_ENV,
    EncryptionKey,
    EncryptionKeyError,
    default_key_path,
    model_embedding_dims,
)
from fedvit.core.config import Config, ConfigError, parse_config
from fedvit.core.model import build_model, get_weights
from fedvit.core.params import PATCH_EMBED_WEIGHT, POS_EMBED
from fedvit.strategies.encrypted import KeyHandshakeError, group_by_agreement
from tests.helpers import find_key_material, run_in_process

CONFIG = Config()
MODEL = build_model(CONFIG.model, 10, 0)
WEIGHTS = get_weights(MODEL)
L, N1 = model_embedding_dims(MODEL)  # tiny config: P = 8, C = 3, 32 px -> L = 192, N = 16


def key(seed: int = 1) -> EncryptionKey:
    return EncryptionKey.generate(L, N1 - 1, seed=seed)


def test_decrypt_inverts_encrypt_and_only_the_embeddings_change():
    k = key()
    enc = k.encrypt(WEIGHTS)
    for name, w in WEIGHTS.items():
        if name in ENCRYPTED:
            assert not np.allclose(enc[name], w)
        else:
            assert enc[name] is w
    dec = k.decrypt(enc)
    for name in ENCRYPTED:
        np.testing.assert_allclose(dec[name], WEIGHTS[name], rtol=0, atol=1e-6 * np.abs(WEIGHTS[name]).max())
        assert dec[name].dtype == np.float32


def test_encryption_is_the_papers_matrix_products():
    """Ê_pat = E_a E_pat with E_pat = W.reshape(D, L)ᵀ (eq. 3); Ê_pos = E_b E_pos (eq. 7)."""
    k = key()
    enc = k.encrypt(WEIGHTS)
    w = WEIGHTS[PATCH_EMBED_WEIGHT]
    e_pat = w.reshape(w.shape[0], -1).T.astype(np.float64)
    got = enc[PATCH_EMBED_WEIGHT].reshape(w.shape[0], -1).T
    np.testing.assert_allclose(got, k.e_a @ e_pat, atol=1e-6)
    np.testing.assert_array_equal(
        enc[POS_EMBED][0], (k.e_b @ WEIGHTS[POS_EMBED][0].astype(np.float64)).astype(np.float32)
    )


def test_key_matrices_are_as_documented():
    k = key()
    assert np.linalg.cond(k.e_a) < 1 + 1e-9  # orthogonal: the documented bound for generated keys
    np.testing.assert_allclose(k.e_a @ k.e_a.T, np.eye(L), atol=1e-12)
    e_b = k.e_b
    assert e_b[0, 0] == 1 and e_b[0, 1:].sum() == 0 and e_b[1:, 0].sum() == 0  # class row fixed
    assert (e_b.sum(0) == 1).all() and (e_b.sum(1) == 1).all() and set(np.unique(e_b)) == {0.0, 1.0}
    assert not np.array_equal(k.perm, np.arange(N1))
    same, other = key(1), key(2)
    np.testing.assert_array_equal(same.e_a, k.e_a)
    assert not np.allclose(other.e_a, k.e_a)


def test_key_file_round_trip_permissions_and_errors(tmp_path):
    k = key()
    path = tmp_path / "k.safetensors"
    k.save(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    loaded = EncryptionKey.load(path)
    np.testing.assert_array_equal(loaded.e_a, k.e_a)
    np.testing.assert_array_equal(loaded.perm, k.perm)
    assert loaded.init_seed == k.init_seed
    wrong = EncryptionKey.generate(768, 196, seed=0)
    with pytest.raises(EncryptionKeyError, match="L=768, N=196.*L=192, N=16"):
        wrong.encrypt(WEIGHTS)
    save_file({"x": np.zeros(2)}, str(tmp_path / "other.safetensors"))
    with pytest.raises(EncryptionKeyError, match="not a fedvit key file"):
        EncryptionKey.load(tmp_path / "other.safetensors")
    with pytest.raises(EncryptionKeyError, match="cannot read"):
        EncryptionKey.load(tmp_path / "missing.safetensors")
    singular = np.eye(L)
    singular[0, 0] = 1e-9
    with pytest.raises(EncryptionKeyError, match="condition number"):
        EncryptionKey(singular, k.perm, 0)
    with pytest.raises(EncryptionKeyError, match="class row"):
        EncryptionKey(k.e_a, k.perm[::-1].copy(), 0)


def test_masks_move_with_the_position_rows_and_the_patch_embedding_may_not_be_masked():
    k = key()
    rng = np.random.default_rng(0)
    masks = {POS_EMBED: rng.random(WEIGHTS[POS_EMBED].shape) < 0.5, PATCH_EMBED_WEIGHT: np.ones((64, 3, 8, 8), bool)}
    grad = {name: rng.standard_normal(WEIGHTS[name].shape).astype(np.float32) for name in ENCRYPTED}
    masked = {name: g * masks[name] for name, g in grad.items()}
    # masking then encrypting == encrypting the mask and the gradient (E_b permutes both)
    np.testing.assert_array_equal(
        k.encrypt(masked)[POS_EMBED], k.encrypt(grad)[POS_EMBED] * k.encrypt_masks(masks)[POS_EMBED]
    )
    masks[PATCH_EMBED_WEIGHT][0, 0, 0, 0] = False
    with pytest.raises(EncryptionKeyError, match="cannot be masked"):
        k.encrypt_masks(masks)


def test_private_initial_embeddings_come_from_the_secret():
    shapes = {name: WEIGHTS[name].shape for name in ENCRYPTED}
    a, b, c = (
        key(1).private_initial_embeddings(shapes),
        key(1).private_initial_embeddings(shapes),
        key(2).private_initial_embeddings(shapes),
    )
    for name in ENCRYPTED:
        np.testing.assert_array_equal(a[name], b[name])
        assert not np.allclose(a[name], c[name]) and not np.allclose(a[name], WEIGHTS[name])
    assert abs(a[POS_EMBED].std() - 0.02) < 0.005  # timm's pos_embed init scale


def test_config_rules():
    with pytest.raises(ConfigError, match="centralized-evaluation"):
        parse_config({"encryption.mode": "paper"})
    with pytest.raises(ConfigError, match="encryption.mode"):
        parse_config({"encryption.mode": "on", "centralized-evaluation": False})
    on = {"encryption.mode": "paper", "centralized-evaluation": False, "strategy": "masked-fedsgd"}
    with pytest.raises(ConfigError, match="mask.r-patch-embed.*commute"):
        parse_config(on)
    with pytest.raises(ConfigError, match="mask.r-patch-embed"):
        parse_config(on | {"mask.r-patch-embed": 0.0, "mask.r-patterns": "patch_embed.*=0.5"})
    assert parse_config(on | {"mask.r-patch-embed": 0.0}).encryption.enabled
    assert parse_config(on | {"mask.mode": "fixed-position"}).encryption.mode == "paper"


def test_group_by_agreement():
    a = {n: np.ones(3) for n in ENCRYPTED}
    b = {n: np.ones(3) * (1 + 1e-7) for n in ENCRYPTED}  # rounding-level difference: same key
    c = {n: np.ones(3) * 2 for n in ENCRYPTED}
    assert group_by_agreement({0: a, 1: c, 2: b, 3: a}) == [[0, 2, 3], [1]]


# ---------------------------------------------------------------- whole runs in this process (no Ray)

RUN = CONFIG.to_dict() | {
    "num-server-rounds": 3,
    "centralized-evaluation": False,
    "checkpoint-keep": 10,
    "batch-size": 16,
    "fraction-train": 1.0,
}


@pytest.fixture
def key_file(tmp_path, monkeypatch):
    path = tmp_path / "keys" / "key.safetensors"
    key(7).save(path)
    monkeypatch.setenv(KEY_ENV, str(path))
    return path


def _rounds(run_dir):
    return json.loads((run_dir / "metrics.json").read_text())["rounds"]


def _checkpoint(run_dir, rnd):
    arrays = load_file(run_dir / "checkpoints" / f"round-{rnd:04d}.safetensors")
    return {k: v for k, v in arrays.items() if not k.startswith("strategy/")}


@pytest.mark.parametrize(
    "strategy, extra", [("fedsgd", {}), ("fedavg", {"lr": 0.05}), ("masked-fedsgd", {"mask.r-patch-embed": 0.0})]
)
def test_encrypted_run_equals_plain_run_after_every_round(tmp_path, key_file, strategy, extra):
    """The paper's Table I, made strict: same decrypted global model every round, same accuracy."""
    config = RUN | {"strategy": strategy, "out-dir": str(tmp_path / "out")} | extra
    plain_dir, _ = run_in_process(config | {"run-name": "plain"})
    enc_dir, grid = run_in_process(config | {"run-name": "encrypted", "encryption.mode": "paper"})
    k = EncryptionKey.load(key_file)
    for rnd in range(1, 4):
        plain, encrypted = _checkpoint(plain_dir, rnd), _checkpoint(enc_dir, rnd)
        decrypted = k.decrypt(encrypted)
        for name, w in plain.items():
            rel = np.abs(decrypted[name] - w).max() / np.abs(w).max()
            assert rel <= 1e-5, (rnd, name, rel)
        for name in ENCRYPTED:  # the server really held ciphertext
            assert np.abs(encrypted[name] - plain[name]).max() > 0.1 * np.abs(plain[name]).max()
    acc = [(r.get("eval-accuracy"), r.get("eval-loss")) for r in _rounds(plain_dir)]
    acc_enc = [(r.get("eval-accuracy"), r.get("eval-loss")) for r in _rounds(enc_dir)]
    assert [a for a, _ in acc] == [a for a, _ in acc_enc]
    np.testing.assert_allclose([x for _, x in acc[1:]], [x for _, x in acc_enc[1:]], rtol=1e-5)
    _assert_no_key_material(k, tmp_path / "out", grid)


def _assert_no_key_material(k, out_dir, grid=None):
    blobs = {str(p): p.read_bytes() for p in out_dir.rglob("*") if p.is_file()}
    if grid is not None:
        for i, msg in enumerate(grid.sent + grid.received):
            if msg.has_content():
                for rec_name, rec in msg.content.array_records.items():
                    blobs[f"message {i} {rec_name}"] = b"".join(a.data for a in rec.values())
                for rec_name, rec in msg.content.config_records.items():
                    blobs[f"message {i} {rec_name}"] = repr(dict(rec)).encode()
    assert len(blobs) > 5
    assert find_key_material(k, blobs) == []
    assert find_key_material(k, {"control": k.e_a.tobytes() + repr(dict(a=k.perm.tolist())).encode()}) == ["control"]


def test_handshake_names_the_client_with_another_key(tmp_path, key_file):
    other = tmp_path / "other.safetensors"
    key(8).save(other)
    config = RUN | {"out-dir": str(tmp_path / "out"), "encryption.mode": "paper", "num-server-rounds": 1}
    with pytest.raises(KeyHandshakeError, match=r"partition\(s\) \[2\] hold a different encryption key"):
        run_in_process(config, num_nodes=4, node_config={2: {"encryption-key": str(other)}})


def test_a_client_without_a_key_stops_the_run_before_training(tmp_path, monkeypatch):
    from fedvit.strategies.base import ClientSetupError

    monkeypatch.delenv(KEY_ENV, raising=False)
    path = tmp_path / "k.safetensors"
    key(7).save(path)
    config = RUN | {"out-dir": str(tmp_path / "out"), "encryption.mode": "paper"}
    with pytest.raises(ClientSetupError, match="partition 1: encryption is on but this client has no key"):
        run_in_process(config, node_config={0: {"encryption-key": str(path)}, 2: {"encryption-key": str(path)}})


def test_private_init_the_server_adopts_the_secret_embeddings(tmp_path, key_file):
    config = RUN | {"out-dir": str(tmp_path / "out"), "encryption.mode": "private-init", "num-server-rounds": 1}
    run_dir, grid = run_in_process(config | {"run-name": "private"})
    k = EncryptionKey.load(key_file)
    state = load_file(run_dir / "checkpoints" / "round-0001.safetensors")
    agreed = {n: state[f"strategy/encryption/agreed/{n}"] for n in ENCRYPTED}
    secret = k.private_initial_embeddings({n: WEIGHTS[n].shape for n in ENCRYPTED})
    public = {n: state[f"strategy/encryption/public/{n}"] for n in ENCRYPTED}
    for name in ENCRYPTED:
        np.testing.assert_allclose(k.decrypt(agreed)[name], secret[name], atol=1e-6)
        assert not np.allclose(k.decrypt(agreed)[name], public[name])
    # every model the server sent after the handshake carries encrypted secret-derived embeddings
    first_train = next(m for m in grid.sent if m.metadata.message_type == "train")
    np.testing.assert_array_equal(first_train.content["arrays"][POS_EMBED].numpy(), agreed[POS_EMBED])
    _assert_no_key_material(k, tmp_path / "out", grid)


def test_encrypted_payload_differs_from_plain_only_in_the_encrypted_tensors():
    k = key()
    for strategy in ("fedsgd", "fedavg"):
        config = parse_config({"strategy": strategy, "batch-size": 16})
        enc_config = parse_config(
            {"strategy": strategy, "batch-size": 16, "encryption.mode": "paper", "centralized-evaluation": False}
        )
        plain, _ = runner.train(config, 0, 3, WEIGHTS, 1, 0.01)
        encrypted, metrics = runner.train(enc_config, 0, 3, k.encrypt(WEIGHTS), 1, 0.01, key=k)
        assert metrics["crypt-s"] > 0
        for name, value in plain["arrays"].items():
            got = encrypted["arrays"][name]
            if name in ENCRYPTED:
                assert not np.allclose(got, value)
                np.testing.assert_allclose(k.decrypt(encrypted["arrays"])[name], value, atol=1e-6 * np.abs(value).max())
            else:
                np.testing.assert_allclose(got, value, rtol=1e-6, atol=1e-7)


def test_resume_rechecks_the_keys(tmp_path, key_file, monkeypatch):
    config = RUN | {"out-dir": str(tmp_path / "out"), "encryption.mode": "paper", "num-server-rounds": 2}
    run_dir, _ = run_in_process(config | {"run-name": "r"})
    resumed = config | {"run-name": "r", "resume-from": str(run_dir), "num-server-rounds": 3}
    other = tmp_path / "other.safetensors"
    key(9).save(other)
    monkeypatch.setenv(KEY_ENV, str(other))
    with pytest.raises(KeyHandshakeError, match="than the adopted global model"):
        run_in_process(resumed)
    monkeypatch.setenv(KEY_ENV, str(key_file))
    run_in_process(resumed)
    assert [r["round"] for r in _rounds(run_dir)] == [0, 1, 2, 3]


def test_keygen_and_decrypt_commands(tmp_path, monkeypatch, capsys):
    """`fedvit keygen` writes the default client key (found without any setting); `fedvit decrypt` opens the result."""
    from fedvit.app.cli import main

    monkeypatch.delenv(KEY_ENV, raising=False)
    root = str(__import__("pathlib").Path(__file__).parents[1])
    assert main(["keygen", root, "--seed", "3"]) == 0
    assert main(["keygen", root]) == 2 and "--force" in capsys.readouterr().err
    k = EncryptionKey.load(default_key_path())
    np.testing.assert_array_equal(k.e_a, key(3).e_a)  # the tiny default model: L = 192, N = 16
    config = RUN | {"out-dir": str(tmp_path / "out"), "encryption.mode": "paper", "num-server-rounds": 1}
    run_dir, _ = run_in_process(config | {"run-name": "k"})
    out = tmp_path / "plain.safetensors"
    assert (
        main(["decrypt", str(run_dir / "model.safetensors"), "--key", str(default_key_path()), "--out", str(out)]) == 0
    )
    expected = k.decrypt(load_file(run_dir / "model.safetensors"))
    got = load_file(out)
    assert set(got) == set(expected)
    for name in ENCRYPTED:
        np.testing.assert_array_equal(got[name], expected[name])


def test_paper_mode_states_its_known_plaintext_exposure():
    from fedvit.strategies.encrypted import known_plaintext_exposure

    assert "minimum-norm estimate (L=768 > D=384)" in known_plaintext_exposure((384, 3, 16, 16))  # ViT-S/16
    assert "E_a exactly by least squares (L=768 <= D=768)" in known_plaintext_exposure((768, 3, 16, 16))  # ViT-B/16


def test_a_node_joining_later_is_checked_before_it_is_sampled(tmp_path, key_file):
    from flwr.app import Array, ArrayRecord

    from fedvit.app.server_app import make_strategy
    from tests.helpers import LocalGrid

    other = tmp_path / "other.safetensors"
    key(8).save(other)
    config = parse_config(RUN | {"encryption.mode": "paper"})
    grid = LocalGrid(config.to_dict(), 3, node_config={2: {"encryption-key": str(other)}})
    late = grid.contexts.pop(102)  # partition 2 connects after the setup handshake
    strategy = make_strategy(config)
    strategy.discover(grid)
    strategy.prepare_initial(grid, ArrayRecord({k: Array(v) for k, v in WEIGHTS.items()}))
    assert strategy.verified == {100, 101}
    grid.contexts[102] = late
    with pytest.raises(
        KeyHandshakeError, match=r"partition\(s\) \[2\] hold a different encryption key than the adopted"
    ):
        strategy.sample(grid, 1, 1.0, stream=0)
