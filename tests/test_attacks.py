"""Attacks (APRIL and defence-aware closed forms), metrics, the eavesdropper's captures and the audit CLI."""

import dataclasses
import inspect
import json

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file

from fedvit.attacks import april
from fedvit.audit.benchmark import DEFENCES, client_update_and_labels, defence_config
from fedvit.audit.fedvit_run import fedvit_observation
from fedvit.audit.metrics import minimum_norm_limit, psnr, ssim
from fedvit.audit.registry import IMAGE_ATTACKS
from fedvit.clients.training import fedsgd_gradient
from fedvit.core.config import Config, ModelConfig, parse_config
from fedvit.core.data import synthetic
from fedvit.core.model import build_model, get_weights
from fedvit.observed.observation import Observation
from tests.helpers import run_in_process

VIT_S = ModelConfig(name="vit_small_patch16_224", img_size=0, patch_size=0, embed_dim=0, depth=0, num_heads=0)


def single_image_update(model_config: ModelConfig, train_steps: int = 0) -> tuple[Observation, np.ndarray]:
    """A real FedSGD gradient of one synthetic image (optionally after a few SGD steps on other images)."""
    model = build_model(model_config, 10, 0)
    img = int(model.patch_embed.img_size[0])
    images = synthetic(40, 10, 0, "train")
    rng = np.random.default_rng(0)
    for _ in range(train_steps):
        step = fedsgd_gradient(model, images, np.arange(1, 40), 8, img, rng, torch.device("cpu"))
        with torch.no_grad():
            for name, p in model.named_parameters():
                p -= 0.05 * torch.as_tensor(step.arrays[name])
    result = fedsgd_gradient(model, images, np.array([0]), 1, img, rng, torch.device("cpu"))
    truth = images.batch(result.batch_indices, img)[0][0].numpy()
    config = dataclasses.replace(Config(), model=model_config)
    return fedvit_observation(config, result.arrays, get_weights(model), 10), truth


def test_metrics_settings_are_the_standard_ones():
    truth = np.random.default_rng(0).random((3, 32, 32))
    assert psnr(truth, truth) == 200.0 and ssim(truth, truth) == pytest.approx(1.0)
    shifted = np.clip(truth + 0.1, 0, 1)
    mse = np.mean((shifted - truth) ** 2)
    assert psnr(shifted, truth) == pytest.approx(10 * np.log10(1 / mse), abs=1e-6)
    assert ssim(np.random.default_rng(1).random((3, 32, 32)), truth) < 0.1


@pytest.mark.parametrize("steps", [0, 5], ids=["random-init", "trained"])
def test_embedding_route_recovers_the_image_exactly(steps):
    obs, truth = single_image_update(ModelConfig(), steps)
    rec = april.embedding_route(obs)
    assert psnr(rec.image, truth) >= 60 and ssim(rec.image, truth) >= 0.99, rec.note


def test_embedding_route_on_vit_s16_224():
    obs, truth = single_image_update(VIT_S)
    rec = april.embedding_route(obs)  # timing lives in benchmarks/; here: correctness at the real shape
    assert psnr(rec.image, truth) >= 60 and ssim(rec.image, truth) >= 0.99


def test_attention_route_reaches_the_minimum_norm_limit_on_the_no_ln_block_and_fails_on_pre_ln():
    no_ln = ModelConfig(embed_dim=128, first_block="no-ln")
    obs, truth = single_image_update(no_ln)
    limit = psnr(minimum_norm_limit(truth, obs), truth)
    got = psnr(april.attention_route(obs).image, truth)
    assert limit < 30 and abs(got - limit) < 0.5, (got, limit)  # L = 192 > D = 128: the projection is the best
    obs, truth = single_image_update(ModelConfig())
    assert psnr(april.attention_route(obs).image, truth) < 12  # pre-LN: the paper's identity does not hold


def test_attacks_never_receive_ground_truth():
    """The attacker boundary is in the signatures: every attack takes an Observation and nothing else required."""
    fields = {f.name for f in dataclasses.fields(Observation)}
    assert not fields & {"truth", "image", "images", "labels", "batch", "ground_truth"}
    # nor fedvit's run config: the audit resolves what it says (model, recipe, defence, seed) into typed fields
    assert "config" not in fields and not any("Config" in str(f.type) for f in dataclasses.fields(Observation))
    obs, _ = single_image_update(ModelConfig())
    masked = dataclasses.replace(obs, masks={n: np.ones_like(v, bool) for n, v in obs.update.items()})
    assert masked is not None
    for attack in [a.run for a in IMAGE_ATTACKS] + [april.known_plaintext_route]:
        params = list(inspect.signature(attack).parameters.values())
        assert params[0].annotation in ("Observation", Observation)
        assert all(p.default is not inspect.Parameter.empty for p in params[1:])


def _defence_update(tmp_path, defence: str, model: dict | None = None, partition: int = 0):
    return _defence_update_of(defence_config(parse_config(model or {}), DEFENCES[defence], 2, tmp_path), partition)


def _defence_update_of(config, partition: int = 0):
    obs, images, _ = client_update_and_labels(config, partition, 2, seed_key=1000)
    return obs, images[0]


def test_mask_aware_attack_undoes_random_binary_weights_at_r02(tmp_path):
    obs, truth = _defence_update(tmp_path, "mask-fresh-r0.2")
    assert psnr(april.embedding_route(obs).image, truth) < 15  # naive APRIL on zero-filled gradients
    rec = april.masked_embedding_route(obs)
    assert psnr(rec.image, truth) >= 60, rec.note


def test_mask_aware_attack_with_a_complete_position_gradient_is_per_column(tmp_path):
    config = defence_config(parse_config({}), DEFENCES["mask-fresh-r0.5"] | {"mask.r-pos-embed": 0.0}, 2, tmp_path)
    obs, truth = _defence_update_of(config)
    rec = april.masked_embedding_route(obs)
    assert "per-column" in rec.note and psnr(rec.image, truth) >= 60


def test_fixed_position_leaves_no_closed_form(tmp_path):
    obs, _ = _defence_update(tmp_path, "fixed-position")
    assert april.embedding_route(obs).image is None
    assert april.fixed_position(obs).image is None


@pytest.mark.parametrize(
    ("model", "exact"), [({}, False), ({"model.patch-size": 4, "model.embed-dim": 96}, True)], ids=["L>D", "L<=D"]
)
def test_encryption_keyless_gives_noise_and_a_known_plaintext_pair_breaks_it_when_l_le_d(tmp_path, model, exact):
    obs, truth = _defence_update(tmp_path, "encryption-paper", model)
    assert psnr(april.embedding_route(obs).image, truth) < 15  # the encrypted image, not the image
    rec = april.known_plaintext_route(obs)
    got = psnr(rec.image, truth)
    if exact:  # L = 48 <= D = 96 (and N = 64 < D): E_a and E_b are recovered exactly
        assert got >= 60 and "E_a exact, E_b exact" in rec.note
    else:  # L = 192 > D = 64: the minimum-norm limit, and no better
        limit = psnr(minimum_norm_limit(truth, obs), truth)
        assert abs(got - limit) < 0.5 and "minimum-norm" in rec.note
    private, _ = _defence_update(tmp_path, "encryption-private-init", model)
    assert april.known_plaintext_route(private).image is None  # no plaintext/ciphertext pair exists


# ---------------------------------------------------------------- captures and the audit

CAPTURE = Config().to_dict() | {
    "num-server-rounds": 2,
    "batch-size": 1,
    "centralized-evaluation": False,
    "capture.enabled": True,
    "capture.ground-truth": True,
}


def test_capture_is_exact_and_does_not_change_training(tmp_path):
    """fedvit's run records through the one capture_mod and CapturingStrategy, in the one layout (run-<id>/captures/
    round-N/node-<id>), with the node's partition; what they stored is byte for byte what crossed the wire."""
    from fedvit.capture.writer import plain_content

    base = CAPTURE | {"out-dir": str(tmp_path)}
    with_capture, grid = run_in_process(base | {"run-name": "on"}, polling=True)  # Flower's message ids
    without, _ = run_in_process(
        base | {"run-name": "off", "capture.enabled": False, "capture.ground-truth": False}, polling=True
    )
    a, b = load_file(with_capture / "model.safetensors"), load_file(without / "model.safetensors")
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not list(without.glob("run-*"))
    captures = with_capture / "run-1" / "captures"
    sent = [m for m in grid.received if m.metadata.message_type == "train"]
    stored = load_file(captures / "round-0002" / "node-101.sent.safetensors")
    reply = plain_content(next(m for m in sent[3:] if plain_content(m)["metrics"]["partition-id"] == 1))
    assert set(stored) == {f"arrays/{k}" for k in reply["arrays"].keys()}
    assert all(np.array_equal(stored[f"arrays/{k}"], v.numpy()) for k, v in reply["arrays"].items())
    manifest = json.loads((captures / "round-0002" / "node-101.json").read_text())
    assert manifest["round"] == 2 and manifest["partition"] == 1 and manifest["node"] == 101
    assert manifest["run_config"]["capture.enabled"] and manifest["observer"] == "client-mod"
    server = load_file(captures / "server" / "round-0002" / "node-101.sent.safetensors")  # the server's view
    assert set(server) == set(stored) and all(np.array_equal(server[k], stored[k]) for k in stored)
    assert (captures / "server" / "round-0001" / "node-100.received.safetensors").is_file()
    assert (with_capture / "run-1" / "ground-truth" / "round-0001" / "node-100.safetensors").is_file()


def test_capture_selection_by_round_and_partition(tmp_path):
    run_dir, _ = run_in_process(
        CAPTURE | {"out-dir": str(tmp_path), "run-name": "sel", "capture.rounds": "2", "capture.partitions": "0,2"},
        polling=True,
    )
    captures = run_dir / "run-1" / "captures"
    assert sorted(p.name for p in captures.glob("round-*/node-*.json")) == ["node-100.json", "node-102.json"]
    server = sorted(p.name for p in captures.glob("server/round-*/node-*.json") if p.stem.split("-")[-1].isdigit())
    assert server == ["node-100.json", "node-102.json"]  # train exchanges (evaluate ones carry their type)
    assert not (captures / "round-0001").exists()


SMALL_BUDGET = ["-c", "audit.iterations=20", "-c", "audit.restarts=1"]  # the optimisation attack, briefly


def test_audit_cli_end_to_end_on_a_captured_run(tmp_path, capsys):
    from fedvit.app.cli import main

    run_dir, _ = run_in_process(CAPTURE | {"out-dir": str(tmp_path), "run-name": "audited"})
    assert main(["audit", str(run_dir), "--out", str(tmp_path / "audit"), *SMALL_BUDGET]) == 0
    report = json.loads((tmp_path / "audit" / "audit.json").read_text())
    naive = [r for r in report["rows"] if r["attack"] == "APRIL-E (naive)"]
    assert len(naive) == 6 and all(r["psnr"] >= 60 for r in naive)  # 3 clients x 2 rounds, batch size 1
    assert "CW-SSIM" in report["metrics"]["ssim"] and (tmp_path / "audit" / "grid.png").is_file()
    frontier = json.loads((tmp_path / "audit" / "frontier.json").read_text())["best"]
    assert {r["setting"] for r in frontier} == {"round 1, B=1, FedSGD", "round 2, B=1, FedSGD"}
    assert "Leakage vs utility frontier" in capsys.readouterr().out  # printed for the run's rounds
    assert main(["audit", str(tmp_path / "nothing"), "--out", str(tmp_path / "a2")]) == 2
    assert "no captures" in capsys.readouterr().err
    assert main(["audit", str(run_dir), "--out", str(tmp_path / "a3"), "--model", "resnet18"]) == 2
    assert "run config names its model" in capsys.readouterr().err  # fedvit's captures need no --model
    assert main(["audit", str(run_dir), "--out", str(tmp_path / "a4"), "--images", "2"]) == 2
    assert "--images: for --benchmark only" in capsys.readouterr().err
    assert main(["audit", "--benchmark", "--out", str(tmp_path / "a5"), "--data", "cifar10"]) == 2
    assert "--data: the benchmark scores against the images its own clients trained on" in capsys.readouterr().err
    assert main(["audit", "--benchmark", "--out", str(tmp_path / "a6"), "--leakage", "membership"]) == 2
    assert "--leakage: the benchmark measures every leakage type" in capsys.readouterr().err
    assert main(["audit", str(run_dir), "--out", str(tmp_path / "a7"), "--leakage", "membership,label"]) == 2
    assert "leakage must name some of labels, membership, images, got ['label', 'membership']" in (
        capsys.readouterr().err)  # fmt: skip


def test_captures_in_the_old_layout_get_one_clear_error(tmp_path, capsys):
    from fedvit.app.cli import main

    old = tmp_path / "run" / "captures" / "round-0001"
    old.mkdir(parents=True)
    (old / "partition-0.json").write_text("{}")
    assert main(["audit", str(tmp_path / "run"), "--out", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "partition-P" in err and "154885d" in err


def test_audit_refuses_a_capture_from_another_model(tmp_path):
    from fedvit.audit.pipeline import run_audit

    run_dir, _ = run_in_process(CAPTURE | {"out-dir": str(tmp_path), "run-name": "x", "capture.rounds": "1"})
    manifest_path = run_dir / "run-1" / "captures" / "round-0001" / "node-100.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["run_config"]["model.embed-dim"] = 96
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="does not match the model of its run config"):
        run_audit(run_dir, tmp_path / "audit")


def test_audit_benchmark_writes_the_table_and_the_figure4_grid(tmp_path):
    from fedvit.app.cli import main

    out = tmp_path / "bench"
    assert (
        main(
            [
                "audit",
                "--benchmark",
                "--images",
                "2",
                "--defences",
                "plain,encryption-paper",
                "--out",
                str(out),
                *SMALL_BUDGET,
            ]
        )
        == 0  # fmt: skip
    )
    report = json.loads((out / "audit.json").read_text())
    summary = {(r["defence"], r["attack"]): r for r in report["summary"]}  # defences as --defences names them
    assert summary[("plain", "APRIL-E (naive)")]["psnr"] >= 60
    assert summary[("encryption-paper", "APRIL-E (naive)")]["psnr"] < 15
    assert (out / "fig4.png").is_file() and (out / "audit.md").read_text().startswith("# fedvit audit benchmark")


def test_collusion_known_images_break_both_encryption_modes(tmp_path):
    """13 known images (208 patches >= L = 192) and their updates: E_b from the patch Gram matrices, E_a exactly."""
    from fedvit.audit.benchmark import run_benchmark

    budget = {"audit.iterations": 5, "audit.restarts": 1}
    rows = run_benchmark(parse_config(budget), 14, tmp_path / "bench", ["encryption-private-init"])
    collusion = [r for r in rows if r["attack"] == "known images (collusion)"]
    assert len(collusion) == 14 and all(r["psnr"] >= 60 for r in collusion)
    assert all(r["psnr"] < 15 for r in rows if r["attack"] == "APRIL-E (naive)")
