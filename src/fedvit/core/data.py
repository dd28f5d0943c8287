"""Datasets (synthetic, CIFAR-10, image folders), bilinear resizing, seeded partitioning and class-stratified
subsets (never "the first N": image folders and CIFAR-style test sets come sorted by class)."""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from fedvit.core.config import ConfigError, DataConfig

SYNTHETIC_SIZE = 32  # native resolution of the generated images


class DatasetUnavailableError(RuntimeError):
    """The configured dataset cannot be found or downloaded."""


@dataclass(frozen=True, eq=False)
class ImageSet:
    """Labelled images: either a uint8 tensor [N, C, H, W] in memory or a list of image files."""

    labels: np.ndarray
    num_classes: int
    pixels: torch.Tensor | None = None
    files: tuple[str, ...] = ()

    def __len__(self) -> int:
        return len(self.labels)

    def batch(self, indices: np.ndarray, img_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Images in [0, 1] resized bilinearly to ``img_size`` (as the papers do), and labels."""
        idx = np.asarray(indices, dtype=np.int64)
        if self.pixels is not None:
            x = self.pixels[torch.from_numpy(idx)].float().div_(255.0)
            x = _resize(x, img_size)
        else:
            x = torch.stack([_resize(_read_image(self.files[i]).unsqueeze(0), img_size)[0] for i in idx])
        return x, torch.from_numpy(self.labels[idx].astype(np.int64))


def _resize(x: torch.Tensor, size: int) -> torch.Tensor:
    """Bilinear with antialiasing: what torchvision's ``resize`` computes for float images (bit-identical, tested),
    without importing torchvision (its import pulls torch._dynamo: seconds per fresh ClientApp process)."""
    if x.shape[-1] == size and x.shape[-2] == size:
        return x
    return F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False, antialias=True).clamp_(0, 1)


def _read_image(path: str) -> torch.Tensor:
    from torchvision.io import ImageReadMode, decode_image

    return decode_image(path, mode=ImageReadMode.RGB).float().div_(255.0)


# --------------------------------------------------------------------------- loading


def synthetic(num_samples: int, num_classes: int, seed: int, split: str) -> ImageSet:
    """Deterministic class-conditional RGB images: a smooth per-class template plus noise.

    Templates depend only on ``seed`` so train and test share classes; samples
    differ per split. Labels are balanced (round-robin, then shuffled).
    """
    template_rng = np.random.default_rng([seed, 0x5EED])
    coarse = torch.from_numpy(template_rng.random((num_classes, 3, 4, 4), dtype=np.float32))
    templates = F.interpolate(coarse, size=(SYNTHETIC_SIZE, SYNTHETIC_SIZE), mode="bilinear", align_corners=False)
    split_id = {"train": 1, "test": 2}[split]
    rng = np.random.default_rng([seed, split_id])
    labels = rng.permutation(np.arange(num_samples) % num_classes)
    noise = torch.from_numpy(rng.normal(0.0, 0.12, (num_samples, 3, SYNTHETIC_SIZE, SYNTHETIC_SIZE)).astype(np.float32))
    gain = torch.from_numpy(rng.uniform(0.8, 1.2, (num_samples, 1, 1, 1)).astype(np.float32))
    images = (templates[torch.from_numpy(labels)] * gain + noise).clamp(0, 1)
    return ImageSet(labels=labels, num_classes=num_classes, pixels=(images * 255).round().to(torch.uint8))


def cifar10(root: str, download: bool, split: str) -> ImageSet:
    """CIFAR-10 via torchvision from ``root`` (``root/cifar-10-batches-py``), downloading if allowed."""
    from torchvision.datasets import CIFAR10

    root = os.path.abspath(os.path.expanduser(root))
    try:
        ds = CIFAR10(root, train=(split == "train"), download=download)
    except Exception as err:  # torchvision raises RuntimeError / URLError / OSError
        raise DatasetUnavailableError(
            f"CIFAR-10 is not under {root}/cifar-10-batches-py and could not be downloaded "
            f"({type(err).__name__}: {err}). Offline: copy the extracted 'cifar-10-batches-py' folder "
            "there or set data.root to its parent."
        ) from err
    pixels = torch.from_numpy(ds.data).permute(0, 3, 1, 2).contiguous()
    return ImageSet(labels=np.asarray(ds.targets, dtype=np.int64), num_classes=10, pixels=pixels)


def imagefolder(path: str, split: str, seed: int) -> ImageSet:
    """Users' images in ``path/<class>/*`` or ``path/{train,test}/<class>/*``.

    Without train/test subfolders a seeded 80/20 split is made.
    """
    from torchvision.datasets import ImageFolder

    path = os.path.abspath(os.path.expanduser(path))
    if not os.path.isdir(path):
        raise DatasetUnavailableError(f"data.name=imagefolder:{path}: no such directory")
    has_splits = os.path.isdir(os.path.join(path, "train")) and os.path.isdir(os.path.join(path, "test"))
    folder = ImageFolder(os.path.join(path, split) if has_splits else path)
    files = np.array([f for f, _ in folder.samples])
    labels = np.array([y for _, y in folder.samples], dtype=np.int64)
    if not has_splits:
        order = np.random.default_rng([seed, 0xF01D]).permutation(len(labels))
        cut = int(0.8 * len(order))
        keep = np.sort(order[:cut] if split == "train" else order[cut:])
        files, labels = files[keep], labels[keep]
    return ImageSet(labels=labels, num_classes=len(folder.classes), files=tuple(files.tolist()))


def check_imagefolder(cfg: DataConfig) -> None:
    """For ``imagefolder:<path>``: the folder exists and holds images in class subfolders, else one-line ConfigError.

    Cheap (stops at the first image) and meant for where the data is local (``fedvit check-config``, local runs):
    in a deployment only the clients' machines need the folder.
    """
    from torchvision.datasets.folder import IMG_EXTENSIONS

    path = cfg.imagefolder_path
    if path is None:
        return
    root = os.path.abspath(os.path.expanduser(path))
    if not os.path.isdir(root):
        raise ConfigError("data.name", cfg.name, f"an existing folder ({root} does not exist)")
    splits = [os.path.join(root, s) for s in ("train", "test")]
    for top in splits if all(os.path.isdir(s) for s in splits) else [root]:
        classes = [e.path for e in os.scandir(top) if e.is_dir()]
        if not any(_holds_image(c, IMG_EXTENSIONS) for c in classes):
            raise ConfigError(
                "data.name", cfg.name, f"a folder of <class>/<image> files ({top} holds no images in class folders)"
            )


def _holds_image(folder: str, extensions: tuple[str, ...]) -> bool:
    return any(name.lower().endswith(extensions) for _, _, names in os.walk(folder) for name in names)


@functools.lru_cache(maxsize=4)
def load_dataset(cfg: DataConfig, seed: int, split: str) -> ImageSet:
    """The configured dataset split ("train" or "test"); cached per process."""
    if cfg.name == "synthetic":
        size = cfg.synthetic_train_size if split == "train" else cfg.synthetic_test_size
        return synthetic(size, cfg.synthetic_num_classes, seed, split)
    if cfg.name == "cifar10":
        return cifar10(cfg.root, cfg.download, split)
    if cfg.imagefolder_path is not None:
        return imagefolder(cfg.imagefolder_path, split, seed)
    raise ValueError(f"unknown dataset {cfg.name!r}")


# --------------------------------------------------------------------------- partitioning


def partition_indices(labels: np.ndarray, num_partitions: int, cfg: DataConfig, seed: int) -> list[np.ndarray]:
    """Split sample indices among clients with flwr-datasets' partitioners.

    ``iid``: shuffled equal shares. ``noniid-k``: every client holds exactly k
    classes (Non-IID(k) of the FedWAvg paper; flwr-datasets' pathological
    partitioner, first class deterministic). ``dirichlet``: per-class Dirichlet(alpha)
    proportions.
    """
    from datasets import Dataset
    from flwr_datasets.partitioner import DirichletPartitioner, IidPartitioner, PathologicalPartitioner

    table = Dataset.from_dict({"idx": np.arange(len(labels)), "label": np.asarray(labels)})
    if cfg.partitioner == "iid":
        partitioner = IidPartitioner(num_partitions=num_partitions)
        table = table.shuffle(seed=seed)
    elif cfg.partitioner == "noniid-k":
        partitioner = PathologicalPartitioner(
            num_partitions=num_partitions,
            partition_by="label",
            num_classes_per_partition=cfg.classes_per_client,
            class_assignment_mode="first-deterministic",
            seed=seed,
        )
    elif cfg.partitioner == "dirichlet":
        partitioner = DirichletPartitioner(
            num_partitions=num_partitions,
            partition_by="label",
            alpha=cfg.dirichlet_alpha,
            min_partition_size=1,
            seed=seed,
        )
    else:
        raise ValueError(f"unknown partitioner {cfg.partitioner!r}")
    partitioner.dataset = table
    return [np.asarray(partitioner.load_partition(pid)["idx"], dtype=np.int64) for pid in range(num_partitions)]


def stratified_order(labels: np.ndarray, seed_words: list[int]) -> np.ndarray:
    """Positions of ``labels`` ordered so that every prefix is a seeded, class-stratified sample.

    Each class is shuffled (seeded), and its j-th member is placed at key (j + 0.5) / class size, so the first n
    positions hold every class in proportion to its size (within one sample) whatever the input order.
    """
    labels = np.asarray(labels)
    rng = np.random.default_rng(seed_words)
    keys = np.empty(len(labels))
    for c in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == c))
        keys[members] = (np.arange(len(members)) + 0.5) / len(members)
    tiebreak = rng.random(len(labels))  # classes of equal size interleave in a seeded order
    return np.lexsort((tiebreak, keys))


def stratified_subset(labels: np.ndarray, indices: np.ndarray, n: int, seed: int) -> np.ndarray:
    """``n`` of ``indices`` (all when n is 0 or more than there are), class-stratified by ``labels[indices]``,
    the same for the same seed (so curves over rounds are measured on the same images); sorted."""
    indices = np.asarray(indices)
    if n <= 0 or n >= len(indices):
        return indices
    return np.sort(indices[stratified_order(labels[indices], [seed, 0x5B5E7])[:n]])


def stratified_shards(labels: np.ndarray, num_shards: int, seed_words: list[int]) -> list[np.ndarray]:
    """Split positions of ``labels`` into shards that partition them, differ in size by at most one, and hold each
    class's members dealt round-robin (so a class with at least ``num_shards`` members is in every shard)."""
    labels = np.asarray(labels)
    rng = np.random.default_rng(seed_words)
    shard_of = np.empty(len(labels), dtype=np.int64)
    dealt = 0
    for c in rng.permutation(np.unique(labels)):
        members = rng.permutation(np.flatnonzero(labels == c))
        shard_of[members] = (dealt + np.arange(len(members))) % num_shards
        dealt += len(members)
    return [np.flatnonzero(shard_of == s) for s in range(num_shards)]


@dataclass(frozen=True, eq=False)
class ClientData:
    """One client's view: training indices into ``images``, test indices into ``test_images``."""

    images: ImageSet
    train: np.ndarray
    test: np.ndarray
    test_images: ImageSet


@functools.lru_cache(maxsize=16)
def client_data(cfg: DataConfig, seed: int, partition_id: int, num_partitions: int) -> ClientData:
    """Partition ``partition_id`` and the client's test data; cached.

    ``cfg.client_eval`` "split": the partition is split into local train/test by ``cfg.client_test_fraction``.
    "test-shard": the client trains on its whole partition and tests on its shard of the official test set:
    the shards partition it (so the weighted mean over all clients is the whole test set's score) and each is
    class-stratified (:func:`stratified_shards`).
    """
    if not 0 <= partition_id < num_partitions:
        raise ValueError(f"partition-id {partition_id} outside [0, {num_partitions})")
    images = load_dataset(cfg, seed, "train")
    if num_partitions > len(images):
        raise ValueError(f"{num_partitions} partitions but only {len(images)} training samples")
    indices = _partitions(cfg, seed, num_partitions)[partition_id]
    if cfg.client_eval == "test-shard":
        test_images = load_dataset(cfg, seed, "test")
        shard = stratified_shards(test_images.labels, num_partitions, [seed, 0x5A4D])[partition_id]
        return ClientData(images=images, train=np.sort(indices), test=shard, test_images=test_images)
    order = np.random.default_rng([seed, partition_id, 0x7E57]).permutation(indices)
    n_test = int(round(len(order) * cfg.client_test_fraction))
    if len(order) >= 2:
        n_test = min(max(n_test, 1), len(order) - 1)
    train, test = np.sort(order[n_test:]), np.sort(order[:n_test])
    return ClientData(images=images, train=train, test=test, test_images=images)


@functools.lru_cache(maxsize=4)
def _partitions(cfg: DataConfig, seed: int, num_partitions: int) -> list[np.ndarray]:
    return partition_indices(load_dataset(cfg, seed, "train").labels, num_partitions, cfg, seed)
