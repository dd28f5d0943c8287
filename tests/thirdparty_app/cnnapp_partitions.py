"""The user's side of ``fedvit audit --data``: cnnapp's partition ``i`` as its default run config makes it
(``partition-sizes = "1,2,3,4"``, ``seed = 7``); partitions beyond those serve as decoys."""

from cnnapp.task import load_data, make_canaries, partition_size

SIZES, SEED = "1,2,3,4", 7


def partition(partition_id: int):
    return load_data(partition_id, partition_size(SIZES, partition_id), SEED)


SKEWED_SIZES, SKEWED_ALPHA = "24,24", 0.3  # the app with Dirichlet partitions by default (its own config)


def skewed(partition_id: int):
    """cnnapp's partition with ``partition-sizes="24,24" dirichlet-alpha=0.3`` in its own config."""
    return load_data(partition_id, partition_size(SKEWED_SIZES, partition_id), SEED, SKEWED_ALPHA)


LARGE_SIZES, ALPHA = "1000,1200", 0.5  # the realistic run: 1,000 and 1,200 images per client, Dirichlet(0.5) classes


def large(partition_id: int):
    """cnnapp's partition as the realistic run makes it (``partition-sizes="1000,1200" dirichlet-alpha=0.5
    images="textures"``: photograph-like images)."""
    return load_data(partition_id, partition_size(LARGE_SIZES, partition_id), SEED, ALPHA, "textures")


SMALL_SIZES = "100,120"  # the memorising run: small IID partitions trained for many epochs


def small(partition_id: int):
    """cnnapp's partition as the memorising run makes it (``partition-sizes="100,120" dirichlet-alpha=0
    images="textures"``: classes uniform)."""
    return load_data(partition_id, partition_size(SMALL_SIZES, partition_id), SEED, 0.0, "textures")


MEDIUM_SIZES = "150,180"  # the rounds run: IID partitions, 1 local epoch per round


def medium(partition_id: int):
    """cnnapp's partition as the rounds run makes it (``partition-sizes="150,180" dirichlet-alpha=0
    images="textures"``)."""
    return load_data(partition_id, partition_size(MEDIUM_SIZES, partition_id), SEED, 0.0, "textures")


DP_SIZE, CANARIES = 50, 128  # the DP-SGD runs: 50 photograph-like images per client, 128 canaries planted


def dp(partition_id: int):
    """cnnapp's partition as the DP-SGD runs make it (``partition-sizes="50" images="textures"``, IID)."""
    return load_data(partition_id, DP_SIZE, SEED, 0.0, "textures")


def canaries(partition_id: int):
    """The canaries the DP-SGD runs plant in partition ``partition_id`` (``canaries=128``): (images, labels,
    included)."""
    return make_canaries(partition_id, CANARIES, SEED)


FLOWER_SIZES = "1864,1864"  # a round of Flower's quickstart size: 1,864 images per client, Dirichlet(0.5) classes


def flower(partition_id: int):
    """cnnapp's partition as the quickstart-sized run makes it (``partition-sizes="1864,1864" dirichlet-alpha=0.5
    images="textures"``)."""
    return load_data(partition_id, partition_size(FLOWER_SIZES, partition_id), SEED, ALPHA, "textures")


QUICK_SIZES = "100,120"  # the tutorial script's quick run (docs/build_tutorial.py --sizes 100,120)


def quick(partition_id: int):
    """cnnapp's partition as the tutorial's quick run makes it (``partition-sizes="100,120" dirichlet-alpha=0.5
    images="textures"``)."""
    return load_data(partition_id, partition_size(QUICK_SIZES, partition_id), SEED, ALPHA, "textures")
