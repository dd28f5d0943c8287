"""Re-identification among decoys, leakage vs attacker budget, and attacking a finished run's model."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from fedvit.attacks.reidentification import Gallery, rank, score_batch, similarity
from fedvit.audit.metrics import best_flat_image
from fedvit.audit.user_data import gallery_from_test_split
from fedvit.core.config import parse_config

SYNTHETIC = {"data.name": "synthetic", "data.synthetic-train-size": 64, "data.synthetic-test-size": 60}


def photo_like(count: int, seed: int) -> np.ndarray:
    """Smooth random images [count, 3, 32, 32] in [0, 1] (blurred noise: structure at several scales)."""
    x = torch.rand(count, 3, 8, 8, generator=torch.Generator().manual_seed(seed))
    x = torch.nn.functional.interpolate(x, size=32, mode="bilinear", align_corners=False)
    return (0.7 * x + 0.3 * torch.rand(count, 3, 32, 32, generator=torch.Generator().manual_seed(seed + 1))).numpy()


def test_perfect_reconstructions_are_always_re_identified_and_flat_ones_only_at_chance():
    truths = list(photo_like(8, 0).astype(np.float64))
    gallery = Gallery(photo_like(49, 100).astype(np.float64), "random smooth images")
    perfect = score_batch(dict(enumerate(truths)), truths, gallery, [best_flat_image(t) for t in truths])
    assert perfect["reid-top1"] == 1.0 and perfect["reid-rank"] == 1.0 and perfect["reid-gallery"] == 50
    flats = [best_flat_image(t) for t in truths]
    flat = score_batch({}, truths, gallery, flats)  # every true image left to its flat stand-in
    assert flat["reid-chance"] == pytest.approx(1 / 50)
    assert flat["reid-top1"] <= 2 * flat["reid-chance"]  # a flat image carries no structure
    assert flat["reid-rank"] == pytest.approx(25.5, abs=3)  # the middle of the gallery
    # A noisy but faithful reconstruction is still picked out; pure noise is not.
    rng = np.random.default_rng(0)
    noisy = {j: np.clip(t + rng.normal(0, 0.15, t.shape), 0, 1) for j, t in enumerate(truths)}
    assert score_batch(noisy, truths, gallery, flats)["reid-top1"] >= 0.875
    noise = {j: rng.random(t.shape) for j, t in enumerate(truths)}
    assert score_batch(noise, truths, gallery, flats)["reid-top1"] <= 0.25


def test_similarity_ignores_average_colour_and_brightness_but_not_structure():
    a, b = photo_like(2, 3).astype(np.float64)
    assert similarity(a, 0.5 * a + 0.2) == pytest.approx(1.0)
    assert similarity(a, best_flat_image(a)) == 0.0
    assert abs(similarity(a, b)) < 0.9


def test_decoys_never_include_the_clients_own_images():
    truths = list(photo_like(3, 5).astype(np.float64))
    pool = np.concatenate([photo_like(10, 50), np.stack(truths)]).astype(np.float64)
    gallery = Gallery(pool, "pool with the batch in it")
    assert len(gallery.without(truths).decoys) == 10
    # Were the batch left in, a perfect reconstruction would tie with its own copy and lose top-1 credit.
    assert rank(truths[0], truths[0], gallery) == (1.5, 0.5)
    assert score_batch(dict(enumerate(truths)), truths, gallery, truths)["reid-top1"] == 1.0


def test_a_decoy_is_removed_exactly_when_some_batch_image_is_within_the_tolerance_everywhere():
    """The gallery compares only decoys whose mean is near a batch image's: it removes what the pixel-by-pixel test
    of every pair removes, copies shifted just inside and just outside the tolerance included."""
    from fedvit.attacks.reidentification import SAME_IMAGE_TOLERANCE

    rng = np.random.default_rng(0)
    batch = list(rng.random((40, 3, 8, 8)))
    inside = np.clip(batch[3] + 0.9 * SAME_IMAGE_TOLERANCE, 0, None)
    outside = batch[5].copy()
    outside[0, 0, 0] += 1.1 * SAME_IMAGE_TOLERANCE  # one pixel past the tolerance, the mean barely moved
    decoys = np.concatenate([rng.random((60, 3, 8, 8)), np.stack([batch[0], inside, outside, batch[39]])])
    brute = [not any(np.abs(d - b).max() <= SAME_IMAGE_TOLERANCE for b in batch) for d in decoys]
    kept = Gallery(decoys, "mixed").without(batch).decoys
    assert len(kept) == sum(brute) == 61
    np.testing.assert_array_equal(kept, decoys[np.array(brute)])


def test_the_gallery_comes_from_the_test_split_of_the_runs_dataset():
    config = parse_config(SYNTHETIC)
    gallery = gallery_from_test_split(config, 32, 20)
    assert gallery.decoys.shape == (20, 3, 32, 32) and "synthetic test split" in gallery.source
    from fedvit.core.data import load_dataset

    test, _ = load_dataset(config.data, config.seed, "test").batch(np.arange(60), 32)
    for decoy in gallery.decoys[:3]:  # each decoy is one of the test images
        assert np.abs(test.numpy() - decoy).reshape(60, -1).max(axis=1).min() < 1e-6


def budget_rows(psnrs: list[float], baseline: float, reid: list[float] | None = None) -> list[dict]:
    """Frontier input: one case, the optimisation attack at 600/2400/9600 steps with the given PSNRs."""
    rows = []
    for i, (steps, value) in enumerate(zip((600, 2400, 9600), psnrs, strict=True)):
        rows.append({"defence": "none", "defence-name": "plain", "setting": "B=4, FedSGD", "attack": "opt",
                     "budget": steps, "steps-done": steps, "steps-asked": steps, "psnr": value, "ssim": 0.1,
                     "reid-top1": (reid or [0.0] * 3)[i], "reid-rank": 40.0, "reid-chance": 0.01,
                     "reid-ranks": [40.0] * 8, "seconds": 1.0, "note": ""})  # fmt: skip
    rows.append({"defence": "none", "defence-name": "plain", "setting": "B=4, FedSGD",
                 "attack": "best flat image (reference: no information)", "budget": None, "psnr": baseline,
                 "ssim": 0.2, "seconds": 0.0, "note": ""})  # fmt: skip
    return rows


def test_a_baseline_result_still_rising_with_budget_is_budget_limited_not_no_leakage():
    from fedvit.audit.frontier import best_attacks, frontier_rows

    def verdicts(rows):
        return [r.verdict for r in best_attacks(frontier_rows(rows, {}))]

    rising = verdicts(budget_rows([10.0, 11.0, 12.4], baseline=13.0))
    assert rising[0] == "at baseline" and rising[-1].startswith("budget-limited (still rising: +1.4 dB")
    assert verdicts(budget_rows([12.0, 12.1, 12.2], baseline=13.0)) == ["at baseline"] * 3
    # PSNR over the flat baseline alone is no evidence (a flat image of the right colours gains dB): one rule,
    # re-identification beyond its null (fedvit.audit.evidence.images_clear), the report's and the frontier's
    assert verdicts(budget_rows([12.0, 13.5, 14.5], baseline=13.0))[-1].startswith("budget-limited (still rising")
    assert verdicts(budget_rows([12.0, 13.5, 13.6], baseline=13.0))[-1] == "at baseline"
    # 3 of 8 images re-identified against 1% chance is no accident, whatever PSNR says.
    assert verdicts(budget_rows([12.0, 12.0, 12.0], 13.0, reid=[0, 0.125, 0.375]))[-1] == "leaks"
    # The best-PSNR attack need not be the most recognisable one: the table names the one that is.
    rows = budget_rows([12.0, 12.0, 12.0], 13.0, reid=[0, 0.125, 0.375])
    rows.append(dict(rows[0], attack="closed form", budget=None, psnr=12.9, **{"reid-top1": 0.0}))
    best = best_attacks(frontier_rows(rows, {}))[-1]
    assert best.attack == "closed form" and best.most_recognisable.attack == "opt"
    assert best.most_recognisable.reid_top1 == 0.375
    capped = budget_rows([12.0, 12.0, 12.0], baseline=13.0)
    capped[2]["steps-done"] = 5000
    assert verdicts(capped)[-1] == "budget-limited (time cap: 5000 of 9600 steps)"


def test_budgets_run_the_optimisation_attack_once_per_budget_and_reach_the_frontier(tmp_path, capsys):
    from fedvit.app.cli import main

    out = tmp_path / "bench"
    args = ["audit", "--benchmark", "--images", "1", "--defences", "plain", "--batch-sizes", "2", "--out", str(out)]
    assert main([*args, "--budgets", "8,3", "--decoys", "20", "-c", "audit.restarts=1"]) == 0
    report = json.loads((out / "audit.json").read_text())
    optimisation = [r for r in report["rows"] if r["budget"] is not None]
    assert [(r["budget"], r["steps-done"]) for r in optimisation] == [(3, 3), (8, 8)]  # ascending, both ran fully
    assert all(r["reid-gallery"] == 21 for r in optimisation)
    frontier = json.loads((out / "frontier.json").read_text())
    assert [r["budget-level"] for r in frontier["best"]] == [3, 8]
    assert "budget (steps)" in (out / "frontier.md").read_text() and "re-identified" in (out / "audit.md").read_text()
    assert main([*args, "--budgets", "0,5"]) == 2 and "--budgets" in capsys.readouterr().err
    assert main([*args, "--decoys", "-1", "--out", str(tmp_path / "refused")]) == 2  # before any update is written
    assert "fedvit audit: decoys (--decoys) must be >= 0, got -1" in capsys.readouterr().err
    assert not (tmp_path / "refused").exists()


def test_the_benchmark_attacks_a_finished_runs_model(tmp_path, capsys):
    from safetensors.torch import save_file

    from fedvit.app.cli import main
    from fedvit.audit.benchmark import DEFENCES, client_update_and_labels, defence_config
    from fedvit.core.config import Config
    from fedvit.core.model import build_model, get_weights
    from fedvit.core.results import trained_model

    run = tmp_path / "run"
    run.mkdir()
    config = parse_config(SYNTHETIC | {"model.embed-dim": 32, "model.num-heads": 2})
    model = build_model(config.model, 10, seed=123)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01)  # weights no seed gives
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(run / "model.safetensors"))
    (run / "config.json").write_text(json.dumps(config.to_dict()))

    attacked = trained_model(parse_config(SYNTHETIC), run)  # the run's model.* replace the defaults (embed-dim 64)
    assert attacked.model.embed_dim == 32
    obs, _, _ = client_update_and_labels(defence_config(attacked, DEFENCES["plain"], 1, tmp_path / "b"), 0, 1, 1)
    saved = get_weights(model)
    assert all(np.array_equal(obs.received[n], saved[n]) for n in saved)  # the clients received the run's weights
    with pytest.raises(ValueError, match="no model.safetensors"):
        trained_model(Config(), tmp_path)
    with pytest.raises(ValueError, match="head has 10 classes"):
        trained_model(parse_config(SYNTHETIC | {"data.synthetic-num-classes": 5}), run)
    assert main(["audit", str(run), "--out", str(tmp_path / "a"), "--model-from", str(run)]) == 2
    assert "--model-from: for --benchmark only" in capsys.readouterr().err
