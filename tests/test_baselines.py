"""The FedWAvg paper's baselines and training setup: FedProx, SCAFFOLD, per-round lr decay, ViT heads."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord
from safetensors.numpy import load_file

from fedvit.clients.scaffold import control_path, load_control, updated_control
from fedvit.clients.training import crop_flip, local_epochs
from fedvit.core.config import Config, ConfigError, DataConfig, ModelConfig, parse_config
from fedvit.core.data import load_dataset
from fedvit.core.model import build_model
from fedvit.core.params import VIS_HEAD
from fedvit.strategies import FedAvg, FedProx, Scaffold
from tests.helpers import FakeGrid, reply, run_in_process

SHAPES = {"w": (2,), "b": (1,)}


def record(values: dict[str, list[float]]) -> ArrayRecord:
    return ArrayRecord({k: Array(np.array(v, np.float32)) for k, v in values.items()})


# ---------------------------------------------------------------------------------------------- SCAFFOLD


def test_scaffold_client_control_update_option_ii_by_hand():
    c_i = {"w": np.array([0.5, -1.0], np.float32)}
    c = {"w": np.array([0.25, 0.25], np.float32)}
    x = {"w": np.array([1.0, 2.0], np.float32)}
    y = {"w": np.array([0.6, 2.4], np.float32)}
    # c_i+ = c_i - c + (x - y) / (K * lr) with K = 4, lr = 0.1: (x - y) / 0.4 = [1.0, -1.0]
    out = updated_control(c_i, c, x, y, steps=4, lr=0.1)
    np.testing.assert_allclose(out["w"], [0.5 - 0.25 + 1.0, -1.0 - 0.25 - 1.0], rtol=1e-6)


def test_scaffold_server_update_by_hand():
    s = Scaffold(min_nodes=1)
    grid = FakeGrid({11: 0, 12: 1, 13: 2, 14: 3})  # N = 4 clients in the federation
    x = record({"w": [1.0, 2.0], "b": [0.0]})
    sent = list(s.configure_train(1, x, ConfigRecord({"lr": 0.1}), grid))
    np.testing.assert_array_equal(sent[0].content["control"]["w"].numpy(), [0.0, 0.0])  # c starts at 0
    replies = [
        reply(11, {"w": np.array([2.0, 2.0], np.float32), "b": np.array([1.0], np.float32)},
              records={"control-delta": {"w": np.array([1.0, 0.0], np.float32), "b": np.array([4.0], np.float32)}},
              **{"num-examples": 10}),
        reply(12, {"w": np.array([0.0, 4.0], np.float32), "b": np.array([3.0], np.float32)},
              records={"control-delta": {"w": np.array([3.0, 2.0], np.float32), "b": np.array([0.0], np.float32)}},
              **{"num-examples": 30}),
    ]  # fmt: skip
    arrays, _ = s.aggregate_train(1, replies)
    # x + mean(y_i - x) (uniform, not by num-examples): w = [1, 3], b = [2]
    np.testing.assert_allclose(arrays["w"].numpy(), [1.0, 3.0])
    np.testing.assert_allclose(arrays["b"].numpy(), [2.0])
    # c + |S|/N * mean(dc_i) = 0 + 2/4 * [2, 1] and 2/4 * [2]
    np.testing.assert_allclose(s.control["w"], [1.0, 0.5])
    np.testing.assert_allclose(s.control["b"], [1.0])
    state = s.state_dict()
    restored = Scaffold(min_nodes=1)
    restored.load_state_dict(state)
    np.testing.assert_array_equal(restored.control["w"], s.control["w"])


def test_scaffold_rejects_a_reply_without_control_delta():
    s = Scaffold(min_nodes=1)
    grid = FakeGrid({11: 0, 12: 1})
    list(s.configure_train(1, record({"w": [1.0, 2.0], "b": [0.0]}), ConfigRecord({"lr": 0.1}), grid))
    ok = reply(11, {"w": np.ones(2, np.float32), "b": np.ones(1, np.float32)},
               records={"control-delta": {"w": np.ones(2, np.float32), "b": np.ones(1, np.float32)}},
               **{"num-examples": 1})  # fmt: skip
    missing = reply(12, {"w": np.ones(2, np.float32), "b": np.ones(1, np.float32)}, **{"num-examples": 1})
    s.aggregate_train(1, [ok, missing])
    assert "control-delta" in s.stats[1].rejected[1]


def test_scaffold_run_keeps_client_controls_across_rounds_and_server_control_is_their_mean(tmp_path):
    """Full participation: c = mean_i c_i after every round (Algorithm 1 keeps this invariant)."""
    config = Config().to_dict() | {
        "strategy": "scaffold", "num-server-rounds": 2, "out-dir": str(tmp_path), "run-name": "sc",
        "lr": 0.05, "momentum": 0.0, "batch-size": 128, "centralized-evaluation": False, "fraction-evaluate": 0.0,
    }  # fmt: skip
    run_dir, grid = run_in_process(config)
    shapes = {k: v.shape for k, v in load_file(run_dir / "model.safetensors").items()}
    controls = [load_control(control_path(p, "sc"), shapes) for p in range(3)]
    assert all(control_path(p, "sc").exists() for p in range(3))
    checkpoint = load_file(sorted((run_dir / "checkpoints").glob("round-*.safetensors"))[-1])
    for name in shapes:
        server = checkpoint[f"strategy/control/{name}"]
        np.testing.assert_allclose(server, np.mean([c[name] for c in controls], axis=0), atol=1e-5)
        assert np.abs(server).max() > 0
    # Round 2's message carried round 1's c; each client's delta moved its own c_i (persisted between rounds).
    train_msgs = [m for m in grid.sent if m.metadata.message_type == "train"]
    assert not np.any(train_msgs[0].content["control"]["head.bias"].numpy())
    assert np.any(train_msgs[-1].content["control"]["head.bias"].numpy())


# ---------------------------------------------------------------------------------------------- FedProx


def _local(mu: float, epochs: int = 2) -> tuple[dict, dict]:
    images = load_dataset(DataConfig(synthetic_train_size=96), 0, "train")
    model = build_model(ModelConfig(), images.num_classes, seed=0)
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    result = local_epochs(
        model, images, np.arange(96), epochs=epochs, batch_size=32, lr=0.1, momentum=0.9, img_size=32,
        rng=np.random.default_rng(0), device=torch.device("cpu"), proximal_mu=mu,
    )  # fmt: skip
    return start, result.arrays


def test_fedprox_proximal_term_pulls_local_weights_to_the_global_model():
    def distance(start, end):
        return sum(float(((torch.from_numpy(end[n]) - start[n]) ** 2).sum()) for n in start) ** 0.5

    free, prox = distance(*_local(0.0)), distance(*_local(10.0))
    assert prox < 0.7 * free
    assert distance(*_local(0.0)) == pytest.approx(free)  # deterministic


def test_fedprox_sends_mu_and_aggregates_like_fedavg():
    s = FedProx(proximal_mu=0.1, min_nodes=1)
    grid = FakeGrid({11: 0, 12: 1})
    sent = list(s.configure_train(1, record({"w": [1.0, 2.0], "b": [0.0]}), ConfigRecord({"lr": 0.1}), grid))
    assert all(m.content["config"]["proximal-mu"] == 0.1 for m in sent)
    replies = [
        reply(11, {"w": np.array([2.0, 2.0], np.float32), "b": np.array([1.0], np.float32)}, **{"num-examples": 1}),
        reply(12, {"w": np.array([0.0, 4.0], np.float32), "b": np.array([3.0], np.float32)}, **{"num-examples": 3}),
    ]
    fedavg = FedAvg(min_nodes=1)
    list(fedavg.configure_train(1, record({"w": [1.0, 2.0], "b": [0.0]}), ConfigRecord({"lr": 0.1}), grid))
    ours, theirs = s.aggregate_train(1, replies)[0], fedavg.aggregate_train(1, replies)[0]
    np.testing.assert_array_equal(ours["w"].numpy(), theirs["w"].numpy())
    np.testing.assert_allclose(ours["w"].numpy(), [0.5, 3.5])


# ---------------------------------------------------------------------------------------------- lr decay


def test_lr_decays_per_round_as_in_sec_4_1():
    s = FedAvg(min_nodes=1, lr_decay=0.05)
    grid = FakeGrid({11: 0})
    lrs = [
        list(s.configure_train(r, record({"w": [1.0, 2.0], "b": [0.0]}), ConfigRecord({"lr": 0.1}), grid))[0].content[
            "config"
        ]["lr"]
        for r in (1, 2, 3)
    ]
    np.testing.assert_allclose(lrs, [0.1, 0.1 * 0.95, 0.1 * 0.95**2])
    assert parse_config({"lr-decay": 0.035, "strategy": "fedavg"}).lr_at(3) == pytest.approx(0.02 * 0.965**2)
    with pytest.raises(ConfigError, match="lr-decay"):
        parse_config({"lr-decay": 0.05})  # FedSGD applies lr on the server


# ---------------------------------------------------------------------------------------------- heads


@pytest.mark.parametrize("head", ["cls", "vis", "cls+vis"])
def test_heads_give_class_logits_and_read_the_intended_tokens(head):
    model = build_model(ModelConfig(head=head), 7, seed=0).eval()
    assert model(torch.rand(2, 3, 32, 32)).shape == (2, 7)
    tokens = torch.randn(2, 1 + 16, 64)
    moved_cls, moved_vis = tokens.clone(), tokens.clone()
    moved_cls[:, 0] += 1.0
    moved_vis[:, 1:] += torch.randn(2, 16, 64)
    with torch.no_grad():
        base, after_cls, after_vis = (model.forward_head(t) for t in (tokens, moved_cls, moved_vis))
    uses_cls, uses_vis = not torch.allclose(base, after_cls), not torch.allclose(base, after_vis)
    assert (uses_cls, uses_vis) == {"cls": (True, False), "vis": (False, True), "cls+vis": (True, True)}[head]
    if head == "cls+vis":
        with torch.no_grad():
            expected = model.head(tokens[:, 0]) + getattr(model, VIS_HEAD)(tokens[:, 1:].mean(1))
        torch.testing.assert_close(base, expected)
        assert f"{VIS_HEAD}.weight" in dict(model.named_parameters())


def test_tnt_s_builds_from_timm_with_each_head():
    for head in ("cls", "vis", "cls+vis"):
        model = build_model(ModelConfig(name="tnt_s_patch16_224", img_size=32, patch_size=16, embed_dim=0,
                                        depth=1, num_heads=0, head=head), 10)  # fmt: skip
        assert model(torch.rand(1, 3, 32, 32)).shape == (1, 10)


def test_crop_flip_keeps_shape_and_moves_pixels_deterministically():
    x = torch.rand(6, 3, 32, 32)
    a, b = crop_flip(x, np.random.default_rng(0)), crop_flip(x, np.random.default_rng(0))
    assert a.shape == x.shape and torch.equal(a, b) and not torch.equal(a, x)


def test_config_rules_for_the_new_groups():
    with pytest.raises(ConfigError, match="adversarial.steps"):
        parse_config({"adversarial.steps": 10})  # set but AT is off
    with pytest.raises(ConfigError, match="fedprox.mu"):
        parse_config({"fedprox.mu": 0.5})
    with pytest.raises(ConfigError, match="strategy"):
        parse_config({"strategy": "scaffold", "encryption.mode": "paper", "centralized-evaluation": False})
    with pytest.raises(ConfigError, match="model.head"):
        parse_config({"model.head": "avg"})
    assert parse_config({"adversarial.enabled": True}).adversarial.eps_255 == 8.0


def test_metrics_json_has_robust_accuracy_when_enabled(tmp_path):
    config = Config().to_dict() | {
        "strategy": "fedavg", "num-server-rounds": 1, "out-dir": str(tmp_path), "run-name": "r",
        "adversarial.enabled": True, "adversarial.steps": 2, "robust.enabled": True, "robust.steps": 3,
        "robust.max-samples": 20, "batch-size": 128,
    }  # fmt: skip
    run_dir, _ = run_in_process(config)
    rounds = json.loads((run_dir / "metrics.json").read_text())["rounds"]
    for entry in rounds:
        assert 0.0 <= entry["central-robust-accuracy"] <= 1.0
    assert 0.0 <= rounds[1]["eval-robust-accuracy"] <= 1.0
    assert rounds[1]["adversarial-samples"] > 0


def test_a_model_without_the_requested_head_is_refused_with_the_reason():
    with pytest.raises(ConfigError, match="model.head='cls'"):
        cfg = ModelConfig(name="resnet18", img_size=0, patch_size=0, embed_dim=0, depth=0, num_heads=0, head="cls")
        build_model(cfg, 10)
