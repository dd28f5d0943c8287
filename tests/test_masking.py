import dataclasses

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord

from fedvit.clients import runner
from fedvit.clients.masking import client_seed, draw_masks, fixed_position_masks, locked_masks
from fedvit.core.config import Config, ConfigError, MaskConfig, parse_config
from fedvit.core.masks import decode, encode, mask_rates
from fedvit.core.model import build_model, get_weights
from fedvit.strategies import FedSGD, MaskedFedSGD
from fedvit.strategies.masked_fedsgd import masked_update
from fedvit.strategies.update_counts import chi_square_pvalue, histogram, update_count_pmf
from tests.helpers import FakeGrid, reply


def test_eq12_hand_computed_with_entries_nobody_kept():
    w = {"p": np.array([1.0, 1.0, 1.0], np.float32)}
    a = ({"p": np.array([2.0, 0.0, 6.0], np.float32)}, {"p": np.array([True, False, True])})
    b = ({"p": np.array([4.0, 0.0, 0.0], np.float32)}, {"p": np.array([True, False, False])})
    new, counts = masked_update(w, [a, b], lr=0.5)
    # entry 0: (2 + 4) / 2 = 3 -> 1 - 1.5; entry 1: no client kept it -> unchanged; entry 2: 6 / 1 -> 1 - 3
    np.testing.assert_array_equal(new["p"], np.array([-0.5, 1.0, -2.0], np.float32))
    np.testing.assert_array_equal(counts["p"], [2, 0, 1])


def test_density_is_one_minus_r():
    r, n = 0.3, 1_000_000
    kept = draw_masks({"p": (n,)}, {"p": r}, seed=7, stream=1)["p"].mean()
    # sd of the kept fraction is sqrt(R(1-R)/n) = 0.00046: a wrong R off by 0.003 fails.
    assert abs(kept - (1 - r)) < 0.003


def test_per_layer_overrides_hit_only_their_parameters():
    names = [
        "pos_embed",
        "patch_embed.proj.weight",
        "patch_embed.proj.bias",
        "cls_token",
        "blocks.0.attn.qkv.weight",
        "blocks.1.attn.qkv.weight",
        "head.weight",
    ]
    spec = MaskConfig(r=0.2, r_pos_embed=0.9, r_patch_embed=0.7, r_patterns="blocks.0.*=0.5; head.*=0.0")
    rates = mask_rates(names, spec)
    assert rates == {
        "pos_embed": 0.9,
        "patch_embed.proj.weight": 0.7,
        "patch_embed.proj.bias": 0.7,
        "cls_token": 0.2,
        "blocks.0.attn.qkv.weight": 0.5,
        "blocks.1.attn.qkv.weight": 0.2,
        "head.weight": 0.0,
    }
    masks = draw_masks({n: (200_000,) for n in names}, rates, seed=1, stream=3)
    for name in names:
        assert abs(masks[name].mean() - (1 - rates[name])) < 0.006, name


def test_bad_mask_config_values():
    for key, value in [
        ("mask.r", 1.5),
        ("mask.r", -0.1),
        ("mask.r-pos-embed", 2.0),
        ("mask.mode", "sometimes"),
        ("mask.r-patterns", "blocks.*"),
        ("mask.r-patterns", "head.*=7"),
    ]:
        with pytest.raises(ConfigError, match=f"{key}="):
            parse_config({key: value})


def test_mask_settings_without_the_masked_strategy_are_an_error():
    with pytest.raises(ConfigError, match="mask.r=0.8 .*strategy='masked-fedsgd'"):
        parse_config({"strategy": "fedsgd", "mask.r": 0.8})
    assert parse_config({"strategy": "masked-fedsgd", "mask.r": 0.8}).mask.r == 0.8


def test_fixed_position_zeroes_exactly_the_position_embedding():
    shapes = {"pos_embed": (1, 5, 4), "cls_token": (1, 1, 4), "head.weight": (3, 4)}
    masks = fixed_position_masks(shapes)
    assert not masks["pos_embed"].any() and masks["cls_token"].all() and masks["head.weight"].all()


def test_client_seed_is_private_persistent_and_overridable():
    a = client_seed(3)
    assert client_seed(3) == a and client_seed(4) != a
    assert client_seed(3, node_seed=11) == 11


def test_locked_masks_repeat_across_rounds_and_restarts_fresh_masks_do_not():
    shapes, rates = {"p": (5000,)}, {"p": 0.5}
    cache: dict = {}
    first = locked_masks(0, 5, shapes, rates, cache)
    assert cache  # kept in the client's context state ...
    again = locked_masks(0, 5, shapes, rates, cache)
    restarted = locked_masks(0, 5, shapes, rates, {})  # ... and on disk: a restarted client, empty state
    assert (first["p"] == again["p"]).all() and (first["p"] == restarted["p"]).all()
    other_r = locked_masks(0, 5, shapes, {"p": 0.2}, {})
    assert not (other_r["p"] == first["p"]).all()
    fresh1 = draw_masks(shapes, rates, 5, stream=1)["p"]
    fresh2 = draw_masks(shapes, rates, 5, stream=2)["p"]
    assert not (fresh1 == fresh2).all()


@pytest.mark.parametrize("r", [0.0, 0.2, 0.5, 0.8, 1.0])
def test_sparse_encoding_round_trips_and_is_small(r):
    rng = np.random.default_rng(0)
    grads = {"a": rng.normal(size=(64, 3, 8, 8)).astype(np.float32), "b": rng.normal(size=(37,)).astype(np.float32)}
    masks = draw_masks({k: v.shape for k, v in grads.items()}, {"a": r, "b": r}, seed=2, stream=1)
    values, packed = encode(grads, masks)
    for name, g in grads.items():
        dense, mask = decode(values[name], packed[name], g.shape)
        np.testing.assert_array_equal(dense, np.where(mask, g, 0))
        np.testing.assert_array_equal(mask.ravel(), masks[name])
    sent = sum(v.nbytes for v in values.values()) + sum(p.nbytes for p in packed.values())
    dense_bytes = sum(g.nbytes for g in grads.values())
    assert sent <= ((1 - r) + 1 / 32 + 0.01) * dense_bytes


def test_decode_rejects_inconsistent_payloads():
    values, packed = encode({"p": np.ones(10, np.float32)}, {"p": np.arange(10) % 2 == 0})
    with pytest.raises(ValueError, match="values sent"):
        decode(values["p"][:-1], packed["p"], (10,))
    with pytest.raises(ValueError, match="expected uint8"):
        decode(values["p"], packed["p"][:1], (10,))
    with pytest.raises(ValueError, match="padding"):
        decode(values["p"], packed["p"] | np.array([0, 0xFF], np.uint8), (10,))


# ---------------------------------------------------------------- strategy level, real client code

CONFIG = Config(data=dataclasses.replace(Config().data, synthetic_train_size=120, synthetic_test_size=20))


def federated_rounds(config: Config, strategy, rounds: int, clients: int = 3, tamper=None):
    """Run ``rounds`` rounds of real client training + the strategy's aggregation, in process."""
    model = build_model(config.model, 10, config.seed)
    weights = get_weights(model)
    grid = FakeGrid({100 + p: p for p in range(clients)})
    for rnd in range(1, rounds + 1):
        record = ArrayRecord({k: Array(v) for k, v in weights.items()})
        list(strategy.configure_train(rnd, record, ConfigRecord(), grid))
        replies = []
        for p in range(clients):
            records, metrics = runner.train(config, p, clients, weights, rnd, config.lr, mask_seed=1000 + p)
            if tamper is not None:
                records = tamper(p, records)
            if records is not None:
                replies.append(reply(100 + p, records=records, **metrics))
        new, _ = strategy.aggregate_train(rnd, replies)
        if new is not None:
            weights = {k: a.numpy() for k, a in new.items()}
    return weights


def masked_config(**mask) -> Config:
    return dataclasses.replace(CONFIG, strategy="masked-fedsgd", mask=MaskConfig(**mask))


def test_r0_is_bit_identical_to_plain_fedsgd():
    plain = federated_rounds(CONFIG, FedSGD(lr=CONFIG.lr, min_nodes=1), rounds=2)
    cfg = masked_config(r=0.0)
    masked = federated_rounds(cfg, MaskedFedSGD(lr=cfg.lr, mask=cfg.mask, min_nodes=1), rounds=2)
    for k in plain:
        assert (plain[k] == masked[k]).all(), k


def test_r1_leaves_the_model_unchanged():
    cfg = masked_config(r=1.0)
    start = get_weights(build_model(cfg.model, 10, cfg.seed))
    end = federated_rounds(cfg, MaskedFedSGD(lr=cfg.lr, mask=cfg.mask, min_nodes=1), rounds=2)
    for k in start:
        assert (start[k] == end[k]).all(), k


def _drop_mask(p, records):
    return {"arrays": records["arrays"]} if p == 1 else records


def _short_mask(p, records):
    if p == 1:
        records["masks"]["head.bias"] = records["masks"]["head.bias"][:-1]
    return records


def _count_mismatch(p, records):
    if p == 1:
        records["arrays"]["pos_embed"] = records["arrays"]["pos_embed"][:-1]
    return records


def _nan(p, records):
    if p == 1:
        records["arrays"]["head.weight"][0] = np.nan
    return records


def _float64(p, records):
    if p == 1:
        records["arrays"]["cls_token"] = records["arrays"]["cls_token"].astype(np.float64)
    return records


@pytest.mark.parametrize(
    "tamper, reason",
    [
        (_drop_mask, "needs both"),
        (_short_mask, "expected uint8"),
        (_count_mismatch, "values sent"),
        (_nan, "NaN"),
        (_float64, "float32"),
    ],
)
def test_malformed_replies_are_rejected_and_leave_no_trace(tamper, reason):
    cfg = masked_config(r=0.5)
    strategy = MaskedFedSGD(lr=cfg.lr, mask=cfg.mask, min_nodes=1)
    tampered = federated_rounds(cfg, strategy, rounds=2, tamper=tamper)
    assert reason in strategy.stats[1].rejected[1]
    without = federated_rounds(
        cfg, MaskedFedSGD(lr=cfg.lr, mask=cfg.mask, min_nodes=1), rounds=2, tamper=lambda p, r: None if p == 1 else r
    )
    for k in without:
        assert (tampered[k] == without[k]).all(), k


# ---------------------------------------------------------------- update counts (Sec. IV-D)


def simulate_counts(mode: str, m: int = 10, n: int = 5, r: float = 0.5, size: int = 20_000):
    """Update counts of the strategy over m rounds with n clients drawing masks of ``mode``."""
    shapes = {"pos_embed": (1, size // 10, 10), "blocks.0.attn.qkv.weight": (size,)}
    mask = MaskConfig(mode=mode, r=r)
    strategy = MaskedFedSGD(lr=0.1, mask=mask, min_nodes=1)
    weights = {k: np.zeros(s, np.float32) for k, s in shapes.items()}
    grid = FakeGrid({10 + c: c for c in range(n)})
    rates = {k: r for k in shapes}
    for rnd in range(1, m + 1):
        list(
            strategy.configure_train(rnd, ArrayRecord({k: Array(v) for k, v in weights.items()}), ConfigRecord(), grid)
        )
        replies = []
        for c in range(n):
            if mode == "fixed-position":
                masks = fixed_position_masks(shapes)
            else:
                masks = draw_masks(shapes, rates, seed=c, stream=rnd if mode == "fresh" else 0)
            values, packed = encode({k: np.ones(s, np.float32) for k, s in shapes.items()}, masks)
            replies.append(reply(10 + c, records={"arrays": values, "masks": packed}, **{"num-examples": 1}))
        strategy.aggregate_train(rnd, replies)
    return strategy


@pytest.mark.parametrize("mode", ["fresh", "locked"])
def test_update_count_histogram_matches_corrected_eq13(mode):
    m, n, r = 10, 5, 0.5
    strategy = simulate_counts(mode, m, n, r)
    observed = histogram(strategy.update_counts, m, None)
    p = chi_square_pvalue(observed, update_count_pmf(m, n, r, locked=(mode == "locked")))
    assert p > 0.01
    # The same data against the other mode's law is rejected: the test can tell them apart.
    assert chi_square_pvalue(observed, update_count_pmf(m, n, r, locked=(mode != "locked"))) < 1e-6


def test_fixed_position_counts_and_report(tmp_path):
    strategy = simulate_counts("fixed-position", m=4, n=3)
    assert (strategy.update_counts["pos_embed"] == 0).all()
    assert (strategy.update_counts["blocks.0.attn.qkv.weight"] == 4).all()
    strategy.write_report(tmp_path)
    import json

    report = json.loads((tmp_path / "update-counts.json").read_text())
    assert report["groups"]["position-embedding"]["empirical"][0] == 1.0
    assert report["groups"]["position-embedding"]["theory"][0] == 1.0
    assert (tmp_path / "plots" / "update-counts.png").is_file()


@pytest.mark.parametrize(
    "strategy, mode",
    [("fedsgd", "fresh"), ("masked-fedsgd", "fresh"), ("masked-fedsgd", "locked"), ("fedavg", "fresh")],
)
def test_client_app_handler_replies_with_the_right_records(strategy, mode):
    """The ClientApp's train handler itself (Flower records in and out), without a runtime."""
    from flwr.app import Context, Message, RecordDict

    from fedvit.app import client_app

    cfg = dataclasses.replace(CONFIG, strategy=strategy, mask=MaskConfig(mode=mode))
    weights = get_weights(build_model(cfg.model, 10, cfg.seed))
    context = Context(
        run_id=1,
        node_id=5,
        node_config={"partition-id": 0, "num-partitions": 3},
        state=RecordDict(),
        run_config=cfg.to_dict(),
    )
    for rnd in (1, 2):
        msg = Message(
            RecordDict(
                {
                    "arrays": ArrayRecord({k: Array(v) for k, v in weights.items()}),
                    "config": ConfigRecord({"server-round": rnd, "lr": 0.01}),
                }
            ),
            dst_node_id=5,
            message_type="train",
        )
        out = client_app.train(msg, context)
        records = set(out.content.array_records)
        assert records == ({"arrays", "masks"} if strategy == "masked-fedsgd" else {"arrays"})
        assert out.content["metrics"]["num-examples"] > 0
    assert ("locked-mask" in context.state.array_records) == (strategy == "masked-fedsgd" and mode == "locked")
