"""The clients' data the audit scores against, when the user gives it: a loader or a fedvit dataset name, and the
node → partition mapping. Only the scoring reads it; no path hands it to an attack."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from attacks.exchanges import AuditInputError
from attacks.model_spec import import_callable
from attacks.reidentification import DEFAULT_DECOYS, Gallery
from core.config import is_dataset_name


@dataclasses.dataclass(frozen=True)
class UserData:
    """The client data that scores reconstructions, and the node → partition mapping.

    ``source`` is either the user's loader (``package.module:callable``, ``callable(partition_id) -> (images
    [N, C, H, W] in [0, 1], labels [N])``; decoys: the other partitions named in ``partitions`` and
    ``decoy_partitions``) or a fedvit dataset name as ``data.name`` takes it, partitioned as fedvit's own app
    partitions it (``settings``: further ``data.*`` keys and ``seed``; ``num_partitions``, else the count the
    captured node config recorded; decoys: the dataset's test split)."""

    source: str
    partitions: dict[str, int]
    decoy_partitions: tuple[int, ...] = ()
    app_dir: str | None = None
    settings: dict[str, Any] = dataclasses.field(default_factory=dict)
    num_partitions: int | None = None
    image_size: int = 32  # a named dataset's images are resized to the model's input (square)
    _loaded: dict[int, tuple[np.ndarray, np.ndarray]] = dataclasses.field(
        default_factory=dict, compare=False, repr=False
    )
    _galleries: dict[int, Gallery] = dataclasses.field(default_factory=dict, compare=False, repr=False)

    @property
    def named(self) -> bool:
        return is_dataset_name(self.source)

    def config(self) -> Any:
        """The fedvit Config of a named dataset (its errors name the key that is wrong)."""
        from core.config import ConfigError, parse_config

        keys = {("seed" if k == "seed" else f"data.{k}"): v for k, v in self.settings.items()}
        try:
            return parse_config({"data.name": self.source} | keys)
        except ConfigError as err:
            raise AuditInputError(f"--data {self.source}: {err}") from None

    def load(self, partition: int, recorded_partitions: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """One partition's images and labels, each partition loaded once per audit."""
        if partition not in self._loaded:
            if self.named:
                images, labels = self._named_partition(partition, self.num_partitions or recorded_partitions)
            else:
                images, labels = import_callable(self.source, self.app_dir, "--data")(partition)
            images = np.asarray(images, dtype=np.float64)
            if images.ndim != 4 or images.min() < 0 or images.max() > 1:
                raise AuditInputError(f"--data {self.source}({partition}) must return images [N, C, H, W] in [0, 1]")
            self._loaded[partition] = (images, np.asarray(labels, dtype=np.int64))
        return self._loaded[partition]

    def _named_partition(self, partition: int, count: int | None) -> tuple[np.ndarray, np.ndarray]:
        from core.data import DatasetUnavailableError, client_data

        if count is None:
            raise AuditInputError(
                f"--data {self.source}: how many partitions the data was split into is unknown (the captures did "
                "not record the node config's num-partitions): give --num-partitions"
            )
        config = self.config()
        try:
            part = client_data(config.data, config.seed, partition, count)
        except (DatasetUnavailableError, ValueError) as err:
            raise AuditInputError(f"--data {self.source}, partition {partition} of {count}: {err}") from None
        x, y = part.images.batch(part.train, self.image_size)
        return x.numpy(), y.numpy()


def gallery_for(data: UserData, own: int, size: tuple[int, ...]) -> Gallery:
    """Decoys for partition ``own``: a named dataset's test split (99 images), else every image of the other
    partitions (mapped and decoy), at most 99."""
    if data.named:  # the same decoys for every partition: built once per audit
        from attacks.reidentification import gallery_from_test_split

        if size[-1] not in data._galleries:
            data._galleries[size[-1]] = gallery_from_test_split(data.config(), int(size[-1]))
        return data._galleries[size[-1]]
    decoys = []
    for pid in sorted(set(data.partitions.values()) | set(data.decoy_partitions)):
        if pid != own:
            images = data.load(pid)[0]
            decoys.extend(im for im in images if im.shape == tuple(size))
    decoys = decoys[:DEFAULT_DECOYS]
    stacked = np.stack(decoys) if decoys else np.zeros((0, *size))
    return Gallery(stacked, f"{len(decoys)} images of other partitions ({data.source})")
