import dataclasses

import numpy as np
import pytest

from core.config import DataConfig
from core.data import client_data, load_dataset, partition_indices, synthetic

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
