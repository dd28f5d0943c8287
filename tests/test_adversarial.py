"""PGD and Madry adversarial training (FedWAvg paper, Algorithm 1 lines 14-18)."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedvit.clients.adversarial import PGD, madry_batch, pgd, robust_correct, torch_generator
from fedvit.clients.training import local_epochs
from fedvit.core.config import DataConfig, ModelConfig
from fedvit.core.data import load_dataset
from fedvit.core.model import build_model, classify

CPU = torch.device("cpu")


@functools.lru_cache(maxsize=1)
def trained_tiny():
    """The default tiny ViT after 4 epochs on the synthetic data (clean accuracy well above chance)."""
    torch.manual_seed(0)
    images = load_dataset(DataConfig(), 0, "train")
    model = build_model(ModelConfig(), images.num_classes, seed=0)
    local_epochs(
        model, images, np.arange(len(images)), epochs=4, batch_size=32, lr=0.05, momentum=0.9, img_size=32,
        rng=np.random.default_rng(0), device=CPU,
    )  # fmt: skip
    test = load_dataset(DataConfig(), 0, "test")
    x, y = test.batch(np.arange(64), 32)
    return model.eval(), x, y


def test_trained_model_is_better_than_chance():
    model, x, y = trained_tiny()
    with torch.no_grad():
        assert (classify(model, x).argmax(1) == y).float().mean() > 0.5


def test_pgd_stays_in_the_eps_ball_and_the_pixel_range_and_raises_the_loss():
    model, x, y = trained_tiny()
    attack = PGD(eps=8 / 255, alpha=2 / 255, steps=7)
    grads = [None if p.grad is None else p.grad.clone() for p in model.parameters()]
    adv = pgd(model, x, y, attack, torch_generator([0], CPU))
    assert (adv - x).abs().max() <= attack.eps + 1e-6
    assert adv.min() >= 0.0 and adv.max() <= 1.0
    assert (adv != x).any()
    with torch.no_grad():
        clean, attacked = F.cross_entropy(classify(model, x), y), F.cross_entropy(classify(model, adv), y)
        robust = (classify(model, adv).argmax(1) == y).float().mean()
        natural = (classify(model, x).argmax(1) == y).float().mean()
    assert attacked > clean
    assert robust < natural
    assert model.training is False  # the mode it had before
    for before, p in zip(grads, model.parameters(), strict=True):  # crafting never touches parameter gradients
        assert (before is None and p.grad is None) or torch.equal(before, p.grad)


def test_pgd_respects_a_zero_budget_and_pixels_at_the_bounds():
    model, x, y = trained_tiny()
    assert torch.equal(pgd(model, x, y, PGD(eps=0.0), torch_generator([0], CPU)), x)
    edge = torch.zeros_like(x[:4])
    edge[:2] = 1.0
    adv = pgd(model, edge, y[:4], PGD(), torch_generator([0], CPU))
    assert adv.min() >= 0.0 and adv.max() <= 1.0 and (adv - edge).abs().max() <= 8 / 255 + 1e-6


def test_madry_batch_replaces_exactly_floor_r_b_samples():
    model, x, y = trained_tiny()
    for batch, ratio in [(7, 0.5), (24, 0.5), (10, 0.25), (5, 0.0), (6, 1.0)]:
        mixed, replaced = madry_batch(
            model, x[:batch], y[:batch], ratio, PGD(), np.random.default_rng(1), torch_generator([1], CPU)
        )
        assert len(replaced) == int(np.floor(ratio * batch)) == len(set(replaced.tolist()))
        changed = (mixed != x[:batch]).flatten(1).any(1)
        assert changed.nonzero().flatten().tolist() == replaced.tolist()


def test_madry_batch_is_deterministic_under_a_seed_and_varies_with_it():
    model, x, y = trained_tiny()

    def run(seed):
        return madry_batch(model, x[:24], y[:24], 0.5, PGD(), np.random.default_rng(seed), torch_generator([seed], CPU))

    (a, ia), (b, ib), (c, _) = run(3), run(3), run(4)
    assert torch.equal(a, b) and np.array_equal(ia, ib)
    assert not torch.equal(a, c)


def test_restarts_never_make_the_attack_weaker():
    model, x, y = trained_tiny()
    one = robust_correct(model, x, y, PGD(steps=3, restarts=1), torch_generator([5], CPU))
    three = robust_correct(model, x, y, PGD(steps=3, restarts=3), torch_generator([5], CPU))
    assert not (three & ~one).any()  # the first restart is the same draw: fooled stays fooled


def test_invalid_settings_are_refused():
    with pytest.raises(ValueError, match="invalid PGD"):
        PGD(steps=0)


def test_autoattack_is_no_weaker_than_pgd_and_breaks_everything_at_a_large_eps():
    from fedvit.clients.autoattack import autoattack_correct

    model, x, y = trained_tiny()
    x, y = x[:16], y[:16]
    model.zero_grad(set_to_none=True)
    pgd_correct = robust_correct(model, x, y, PGD(eps=8 / 255, alpha=2 / 255, steps=10), torch_generator([0], CPU))
    apgd = autoattack_correct(model, x, y, 10, 8 / 255, "apgd", seed=0)
    assert apgd.sum() <= pgd_correct.sum()
    with torch.no_grad():
        natural = classify(model, x).argmax(1) == y
    assert not (apgd & ~natural).any()  # a misclassified image never counts as robust
    huge = autoattack_correct(model, x, y, 10, 64 / 255, "apgd", seed=0)
    assert huge.float().mean() <= 0.1  # a large ε: (almost) nothing survives
    assert model.training is False and all(p.grad is None and p.requires_grad for p in model.parameters())


def test_a_naturally_trained_model_is_not_robust_under_autoattack_on_photographs(tmp_path):
    """Acceptance: ≈ 0% under AutoAttack at ε = 8/255 for a plain model. On fedvit's synthetic classes (coarse
    colour blocks) 8/255 cannot flip many images (37.5% survive, measured), so this uses photographs: crops of
    scikit-image's bundled photos, one class per photo."""
    from benchmarks.natural_images import write_natural_images
    from fedvit.clients.autoattack import autoattack_correct

    data = DataConfig(name=f"imagefolder:{write_natural_images(tmp_path / 'photos', per_class=60)}")
    train, test = load_dataset(data, 0, "train"), load_dataset(data, 0, "test")
    torch.manual_seed(0)
    model = build_model(ModelConfig(), train.num_classes, seed=0)
    local_epochs(
        model, train, np.arange(len(train)), epochs=15, batch_size=32, lr=0.05, momentum=0.9, img_size=32,
        rng=np.random.default_rng(0), device=CPU,
    )  # fmt: skip
    x, y = test.batch(np.arange(32), 32)
    with torch.no_grad():
        assert (classify(model.eval(), x).argmax(1) == y).float().mean() >= 0.8
    assert autoattack_correct(model, x, y, train.num_classes, 8 / 255, "apgd", seed=0).float().mean() <= 0.1


def test_autoattack_standard_is_the_reference_ensemble_and_targets_every_other_class_when_fewer():
    from fedvit.clients.autoattack import build_autoattack

    model, _, _ = trained_tiny()
    standard = build_autoattack(model, 10, 8 / 255, "standard", seed=0)
    assert standard.attacks_to_run == ["apgd-ce", "apgd-t", "fab-t", "square"]  # FAB-T included (Croce & Hein)
    assert (standard.apgd_targeted.n_target_classes, standard.fab.n_target_classes) == (9, 9)
    assert (standard.apgd.n_iter, standard.apgd.n_restarts, standard.square.n_queries) == (100, 1, 5000)
    four = build_autoattack(model, 4, 8 / 255, "apgd", seed=0)
    assert four.attacks_to_run == ["apgd-ce", "apgd-t"] and four.apgd_targeted.n_target_classes == 3
    with pytest.raises(ValueError, match="unknown AutoAttack version"):
        build_autoattack(model, 10, 8 / 255, "plus", seed=0)
