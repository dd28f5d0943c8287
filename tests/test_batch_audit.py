"""Batch-audit building blocks: label recovery from the head-bias gradient (fedvit.attacks.labels), one-to-one batch
matching and no-information baselines (fedvit.audit.metrics)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from fedvit.attacks.labels import label_accuracy, label_counts, mean_softmax
from fedvit.core.config import ModelConfig
from fedvit.core.model import build_model, classify
from fedvit.core.params import HEAD_BIAS


def head_bias_gradient(model, x, y) -> np.ndarray:
    model.zero_grad(set_to_none=True)
    F.cross_entropy(classify(model, x), y).backward()
    return dict(model.named_parameters())[HEAD_BIAS].grad.double().numpy()


def test_counts_are_exact_when_the_softmax_is_known_duplicates_included():
    model = build_model(ModelConfig(), 10, seed=0)
    with torch.no_grad():  # a zero head: every softmax is uniform, so the attacker's p̄ is exact
        model.head.weight.zero_()
        model.head.bias.zero_()
    labels = torch.tensor([3, 3, 3, 7, 0, 0, 9, 3])
    x = torch.rand(8, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    counts = label_counts(head_bias_gradient(model, x, labels), 8, mean_softmax(model, (3, 32, 32)))
    assert counts.tolist() == np.bincount(labels.numpy(), minlength=10).tolist()
    assert label_accuracy(counts, labels.numpy()) == 1.0


def test_counts_on_a_random_model_beat_the_top_b_guess():
    model = build_model(ModelConfig(), 10, seed=0)
    rng = np.random.default_rng(2)
    labels = torch.from_numpy(rng.choice(10, size=16, replace=True))
    x = torch.rand(16, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    g = head_bias_gradient(model, x, labels)
    counts = label_counts(g, 16, mean_softmax(model, (3, 32, 32)))
    top_b = np.zeros(10, np.int64)
    top_b[np.argsort(g)[: len(set(labels.tolist()))]] = 1  # the naive guess: one image per most-negative entry
    assert counts.sum() == 16
    assert label_accuracy(counts, labels.numpy()) >= 0.9
    assert label_accuracy(counts, labels.numpy()) > label_accuracy(top_b, labels.numpy())


def test_rounding_keeps_the_batch_size():
    assert label_counts(np.array([-0.3, 0.1, 0.2]), 4, np.array([0.2, 0.4, 0.4])).tolist() == [2, 1, 1]
    assert label_counts(np.array([-0.6, 0.3, 0.3]), 2, np.array([0.4, 0.3, 0.3])).sum() == 2


def test_batch_matching_is_one_to_one_and_finds_the_permutation():
    from fedvit.audit.metrics import match_batch

    rng = np.random.default_rng(0)
    truths = [rng.random((3, 8, 8)) for _ in range(4)]
    recs = [np.clip(truths[j] + 0.01 * rng.standard_normal((3, 8, 8)), 0, 1) for j in (2, 0, 3, 1)]
    pairs = match_batch(recs, truths)
    assert [(i, j) for i, j, _ in pairs] == [(0, 2), (1, 0), (2, 3), (3, 1)]
    assert all(p > 30 for _, _, p in pairs)
    # Two reconstructions of the same image: only one may claim it.
    pairs = match_batch([truths[0], truths[0]], truths[:2])
    assert sorted(j for _, j, _ in pairs) == [0, 1] and min(p for _, _, p in pairs) < 30


def test_no_flat_image_beats_the_flat_baseline():
    from fedvit.audit.metrics import no_information_baselines, psnr

    rng = np.random.default_rng(1)
    truth = rng.random((3, 8, 8))
    base = no_information_baselines(truth, dataset_mean=np.full((3, 8, 8), 0.5))
    for level in (0.3, 0.5, 0.7):
        assert psnr(np.full((3, 8, 8), level), truth) <= base["best flat image"] + 1e-9
    assert set(base) == {"best flat image", "dataset mean image"}


def test_label_attack_on_real_client_updates_and_its_limits(tmp_path):
    from fedvit.attacks.labels import recover_labels
    from fedvit.audit.benchmark import client_update_and_labels, observed_update
    from fedvit.audit.pipeline import run_audit
    from fedvit.audit.registry import LABELS
    from fedvit.core.config import parse_config

    base = {"out-dir": str(tmp_path), "run-name": "labels", "capture.enabled": True, "capture.ground-truth": True,
            "audit.iterations": 10, "audit.restarts": 1}  # fmt: skip
    config = parse_config(base | {"batch-size": 8, "data.synthetic-train-size": 64})
    obs, truth, labels = observed_update(config, 0, 2, 1, tmp_path / "cap")  # a capture with its ground truth
    counts, reason = recover_labels(obs)
    assert reason in ("", "p̄ as equal shares") and counts.sum() == len(labels) == 8  # which p̄ estimate fitted
    assert label_accuracy(counts, labels) >= 0.75
    masked = parse_config(base | {"strategy": "masked-fedsgd", "mask.r": 0.5, "data.synthetic-train-size": 64})
    assert recover_labels(client_update_and_labels(masked, 0, 2, seed_key=1)[0]) == (
        None,
        "the mask hides part of the head-bias gradient",
    )
    rows = run_audit(tmp_path / "cap", tmp_path / "audit")["rows"]
    row = next(r for r in rows if r["attack"] == LABELS)
    assert row["label-accuracy"] == label_accuracy(counts, labels)
    assert "label accuracy" in (tmp_path / "audit" / "audit.md").read_text()


def test_every_scored_update_has_the_no_information_baseline_beside_it(tmp_path):
    from fedvit.audit.benchmark import DEFENCES, defence_config, observed_update
    from fedvit.audit.metrics import BASELINE, best_flat_image, psnr
    from fedvit.audit.pipeline import run_audit
    from fedvit.core.config import parse_config

    budget = parse_config({"audit.iterations": 10, "audit.restarts": 1})
    _, images, _ = observed_update(defence_config(budget, DEFENCES["plain"], 2, tmp_path), 0, 2, 1, tmp_path / "cap")
    truth = images[0]
    rows = run_audit(tmp_path / "cap", tmp_path / "audit")["rows"]
    baseline = next(r for r in rows if r["attack"] == BASELINE)
    assert baseline["psnr"] == psnr(best_flat_image(truth), truth)
    april = next(r for r in rows if r["attack"] == "APRIL-E (naive)")
    assert april["psnr"] > baseline["psnr"] + 20  # the closed form learned the image; a flat guess did not


def test_labels_on_a_trained_model_whose_softmax_on_noise_misleads():
    """Measured on fedvit's trained tiny model (benchmarks/natural_images.py photographs, B = 4): its softmax on
    noise is far from its softmax on the batch; the equal-share estimate fits the gradient and is right."""
    from fedvit.attacks.labels import best_counts

    def labels_of(counts):
        return np.repeat(np.arange(len(counts)), counts).tolist()

    noise = np.array([0.079, 0.149, 0.103, 0.075, 0.033, 0.265, 0.035, 0.167, 0.04, 0.056])
    g = np.array([0.061, 0.097, 0.07, 0.082, 0.059, -0.109, -0.3, -0.152, 0.05, 0.142])  # true labels 5, 6, 6, 7
    assert labels_of(label_counts(g, 4, noise)) == [5, 5, 6, 7]  # the noise estimate alone: one label wrong
    counts, note = best_counts(g, 4, noise)
    assert labels_of(counts) == [5, 6, 6, 7] and note == "p̄ as equal shares"
    g = np.array([-0.163, 0.061, 0.063, 0.101, -0.145, 0.059, 0.153, -0.111, 0.113, -0.13])  # true 0, 4, 7, 9
    assert labels_of(label_counts(g, 4, noise)) == [0, 4, 7, 9]  # every negative entry holds at least one image
    # On a random model the softmax on noise is right, and stays the choice for large batches.
    uniform = np.full(10, 0.1)
    truth = np.array([2, 1, 1, 2, 1, 3, 1, 2, 1, 2])  # 16 images: classes with one image have g_c > 0
    counts, note = best_counts(uniform - truth / 16, 16, uniform)
    assert counts.tolist() == truth.tolist() and note == ""
