import dataclasses

import numpy as np
import pytest

from fedvit.core.config import DataConfig
from fedvit.core.data import client_data, load_dataset, partition_indices, synthetic

LABELS = np.repeat(np.arange(10), 50)  # 500 samples, 10 balanced classes


def parts(partitioner, n=5, seed=0, **kw):
    cfg = dataclasses.replace(DataConfig(), partitioner=partitioner, **kw)
    return partition_indices(LABELS, n, cfg, seed)


@pytest.mark.parametrize("partitioner", ["iid", "noniid-k", "dirichlet"])
def test_partitions_are_disjoint_and_reproducible(partitioner):
    a = parts(partitioner, seed=1)
    flat = np.concatenate(a)
    assert len(flat) == len(set(flat.tolist()))
    assert all(len(p) > 0 for p in a)
    for x, y in zip(a, parts(partitioner, seed=1), strict=True):
        np.testing.assert_array_equal(x, y)
    assert any(not np.array_equal(x, y) for x, y in zip(a, parts(partitioner, seed=2), strict=True))


def test_iid_sizes_and_coverage():
    a = parts("iid", n=5)
    assert sorted(len(p) for p in a) == [100] * 5
    assert sorted(np.concatenate(a).tolist()) == list(range(500))
    assert all(len(set(LABELS[p])) >= 8 for p in a)  # shuffled, not class-sorted


@pytest.mark.parametrize("k", [1, 2, 4])
def test_noniid_k_gives_exactly_k_classes(k):
    for p in parts("noniid-k", n=5, classes_per_client=k):
        assert len(set(LABELS[p].tolist())) == k


def test_dirichlet_covers_all_samples():
    a = parts("dirichlet", n=4, dirichlet_alpha=0.3)
    assert sorted(np.concatenate(a).tolist()) == list(range(500))


def test_synthetic_is_deterministic_and_class_conditional():
    a, b = synthetic(200, 4, seed=0, split="train"), synthetic(200, 4, seed=0, split="train")
    assert (a.pixels == b.pixels).all() and (a.labels == b.labels).all()
    assert np.bincount(a.labels).tolist() == [50] * 4
    means = np.stack([a.pixels[a.labels == c].float().mean(0).numpy() for c in range(4)])
    within = np.mean([a.pixels[a.labels == c].float().std(0).mean().item() for c in range(4)])
    between = means.std(0).mean()
    assert between > within  # classes are separable by their templates


def test_batches_are_resized_bilinearly_to_model_size():
    ds = load_dataset(DataConfig(synthetic_train_size=20), 0, "train")
    x, y = ds.batch(np.arange(4), 48)
    assert x.shape == (4, 3, 48, 48) and x.dtype.is_floating_point
    assert 0.0 <= x.min() and x.max() <= 1.0 and y.shape == (4,)


def test_client_split_is_disjoint_and_cached():
    cfg = DataConfig(synthetic_train_size=100)
    d = client_data(cfg, 0, 1, 4)
    assert len(d.train) + len(d.test) == 25 and not set(d.train) & set(d.test)
    assert client_data(cfg, 0, 1, 4) is d
    with pytest.raises(ValueError, match="partition-id 4"):
        client_data(cfg, 0, 4, 4)


def test_test_shard_evaluation_covers_the_test_set_once():
    cfg = DataConfig(synthetic_train_size=40, synthetic_test_size=30, client_eval="test-shard")
    shards = [client_data(cfg, 0, p, 4) for p in range(4)]
    assert sorted(np.concatenate([d.test for d in shards]).tolist()) == list(range(30))
    assert sum(len(d.train) for d in shards) == 40  # no local split: every training image is trained on
    assert all(d.test_images is load_dataset(cfg, 0, "test") for d in shards)


# ------------------------------------------------------------------ class-sorted folders: samples, not prefixes


def class_sorted_folder(root, classes=10, train_per_class=4, test_per_class=6):
    """``root/{train,test}/<class>/*.png``: torchvision's ImageFolder lists it sorted by class."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, count in (("train", train_per_class), ("test", test_per_class)):
        for c in range(classes):
            folder = root / split / f"class-{c:02d}"
            folder.mkdir(parents=True)
            for i in range(count):
                pixels = (rng.random((8, 8, 3)) * 255).astype(np.uint8)
                Image.fromarray(pixels).save(folder / f"{i}.png")
    return root


def test_stratified_subset_spans_every_class_of_a_sorted_set_and_is_stable():
    from fedvit.core.data import stratified_subset

    labels = np.repeat(np.arange(10), 30)  # sorted by class, like an image folder's test split
    indices = np.arange(len(labels))
    assert set(labels[indices[:20]]) == {0}  # what "the first N" would measure
    subset = stratified_subset(labels, indices, 20, seed=0)
    assert np.bincount(labels[subset], minlength=10).tolist() == [2] * 10
    np.testing.assert_array_equal(subset, stratified_subset(labels, indices, 20, seed=0))  # same every round
    assert not np.array_equal(subset, stratified_subset(labels, indices, 20, seed=1))
    np.testing.assert_array_equal(stratified_subset(labels, indices, 0, seed=0), indices)  # 0 = all
    uneven = np.repeat(np.arange(3), [60, 30, 10])
    counts = np.bincount(uneven[stratified_subset(uneven, np.arange(100), 10, seed=0)], minlength=3)
    assert counts.tolist() == [6, 3, 1]  # in proportion to the class sizes


def test_robust_accuracy_measures_a_stratified_sample_of_a_class_sorted_folder(tmp_path):
    import torch

    from fedvit.clients.adversarial import robust_accuracy
    from fedvit.core.config import ModelConfig, RobustConfig
    from fedvit.core.data import ImageSet
    from fedvit.core.model import build_model

    cfg = DataConfig(name=f"imagefolder:{class_sorted_folder(tmp_path)}")
    test = load_dataset(cfg, 0, "test")
    assert test.labels.tolist() == sorted(test.labels.tolist())
    seen: list[np.ndarray] = []

    class Recording(ImageSet):
        def batch(self, indices, img_size):
            seen.append(np.asarray(indices))
            return super().batch(indices, img_size)

    images = Recording(labels=test.labels, num_classes=test.num_classes, files=test.files)
    model = build_model(ModelConfig(), test.num_classes, 0)
    settings = RobustConfig(enabled=True, steps=1, max_samples=20)
    for server_round in (1, 2):
        robust_accuracy(model, images, np.arange(len(test)), 32, torch.device("cpu"), settings, [0, server_round], 0)
    first, second = (np.concatenate(seen[: len(seen) // 2]), np.concatenate(seen[len(seen) // 2 :]))
    assert np.bincount(test.labels[first], minlength=10).tolist() == [2] * 10
    np.testing.assert_array_equal(first, second)  # the same images in every round


def test_test_shards_of_a_class_sorted_folder_are_stratified(tmp_path):
    cfg = DataConfig(name=f"imagefolder:{class_sorted_folder(tmp_path)}", client_eval="test-shard")
    shards = [client_data(cfg, 0, p, 3) for p in range(3)]
    labels = shards[0].test_images.labels
    together = np.concatenate([s.test for s in shards])
    assert sorted(together.tolist()) == list(range(len(labels)))  # a partition of the test set
    for shard in shards:
        assert set(labels[shard.test].tolist()) == set(range(10))  # each shard holds every class


def test_stratified_shards_hold_every_class_even_for_periodic_orders():
    from fedvit.core.data import stratified_shards

    periodic = np.tile(np.arange(10), 6)  # every 10th image is one class: "every n-th" shards would be single-class
    assert {len(set(periodic[np.arange(p, 60, 10)].tolist())) for p in range(10)} == {1}
    shards = stratified_shards(periodic, 10, [0, 1])
    assert sorted(np.concatenate(shards).tolist()) == list(range(60))
    assert all(len(set(periodic[s].tolist())) == 6 for s in shards)  # 6 members per class: 6 classes per shard
    sizes = [len(s) for s in stratified_shards(np.repeat(np.arange(3), [7, 5, 2]), 4, [0])]
    assert max(sizes) - min(sizes) <= 1


def test_check_config_refuses_an_imagefolder_without_images(tmp_path, capsys):
    from pathlib import Path

    from fedvit.app.run_config import check_config

    root = Path(__file__).parents[1]
    (tmp_path / "empty" / "class-a").mkdir(parents=True)
    (tmp_path / "empty" / "class-a" / "notes.txt").write_text("not an image")
    for folder in (tmp_path / "missing", tmp_path / "empty"):
        assert check_config(root, [f"data.name='imagefolder:{folder}'"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("config error: data.name=") and str(folder) in err
    assert check_config(root, [f"data.name='imagefolder:{class_sorted_folder(tmp_path / 'ok')}'"]) == 0
    assert check_config(root, [f"data.name='imagefolder:{tmp_path / 'missing'}'"], local_data=False) == 0
