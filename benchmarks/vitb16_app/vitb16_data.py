"""The user's side of ``fedvit audit --data`` for vitb16: partition ``i``'s images as the ClientApp loads them."""

from vitb16.task import load_data


def partition(partition_id: int):
    images, labels = load_data(partition_id)
    return images.numpy(), labels.numpy()
