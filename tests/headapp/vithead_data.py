"""The user's side of ``fedvit audit --data`` for vithead: partition ``i`` as the app's default run config makes
it, returned the usual way (a permuted tensor, labels as a list); partitions beyond the clients' serve as decoys."""

from vithead.task import as_tensors, load_pixels, partition_size

SIZES, SEED = "64,80", 7


def partition(partition_id: int):
    images, labels = as_tensors(*load_pixels(partition_id, partition_size(SIZES, partition_id), SEED))
    return images, labels.tolist()
