"""The auditor's side of ``fedvit audit-app``: the app's own data loader, called for scoring on the user's machine
(the attacker's side never runs the app's code). :class:`AppLoader` turns whatever the loader returns (DataLoaders
of dict or tuple batches, datasets, arrays, a (train, test) pair of any of these) into the audit's
``loader(partition) -> (images [N, C, H, W] in [0, 1], labels)``, undoing the app's ``Normalize``
(not a normalisation the code writes out for its batches: the loader's images are then raw pixels).

Partitions ``0 … P-1`` are the clients' training data; ``P + p`` is partition ``p``'s held-out split (the second
value a loader returns, e.g. its test loader), which the audit uses as decoys and non-members.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from fedvit.capture.reader import AuditInputError
from fedvit.observed.app_code import Unread
from fedvit.observed.app_facts import CONTEXT, LoaderCall
from fedvit.observed.model_spec import import_callable


@dataclasses.dataclass
class AppLoader:
    """``loader(partition)`` through the app's own function (see the module docstring)."""

    call: LoaderCall
    app_dir: str
    run_config: dict[str, Any]
    partitions: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    undo: bool = True  # the images come out of the app's Normalize transform (False: raw pixels, normalised later)
    _loaded: dict[int, tuple[np.ndarray, np.ndarray]] = dataclasses.field(default_factory=dict, repr=False)

    @property
    def reference(self) -> str:
        return f"{self.call.function} ({self.call.source})"

    def __call__(self, partition: int) -> tuple[np.ndarray, np.ndarray]:
        """The partition's images and labels, loaded once (audit-app's set-up and the audit both ask for them)."""
        if partition not in self._loaded:
            self._loaded[partition] = self._load(partition)
        return self._loaded[partition]

    def _load(self, partition: int) -> tuple[np.ndarray, np.ndarray]:
        import torch

        held_out, own = divmod(int(partition), self.partitions)
        if held_out > 1:
            raise AuditInputError(f"{self.reference}: partition {partition} is beyond the {self.partitions} "
                                  "partitions and their held-out splits")  # fmt: skip
        try:
            args, keywords = self.call.arguments(own, self.partitions, self.run_config)
        except Unread as err:
            raise AuditInputError(f"the app's data cannot be loaded for scoring: {err}; give --data") from None
        args = [self.context(own) if a is CONTEXT else a for a in args]
        function = import_callable(self.call.function, self.app_dir, "the app's loader")
        with torch.random.fork_rng():  # the app's shuffles and random transforms: the same draw every audit
            torch.manual_seed(own)
            found = function(*args, **keywords)
            split = pick_split(found, held_out, self.reference)
            images, labels = to_arrays(split, f"{self.reference} for partition {own}")
        channels = images.shape[1]
        mean = np.asarray(self.mean * (channels if len(self.mean) == 1 else 1), np.float64).reshape(1, -1, 1, 1)
        std = np.asarray(self.std * (channels if len(self.std) == 1 else 1), np.float64).reshape(1, -1, 1, 1)
        pixels = images * std + mean if self.undo else images  # the audit applies the model's normalisation itself
        if pixels.min() < -1e-3 or pixels.max() > 1 + 1e-3:
            what = f"with the app's Normalize{self.mean}/{self.std} undone" if self.undo else "(the app normalises " \
                   "them later, in its own code)"
            raise AuditInputError(f"{self.reference}: images {what} span [{pixels.min():.2f}, {pixels.max():.2f}], "
                                  "not [0, 1]: give --mean/--std or --data")  # fmt: skip
        return np.clip(pixels, 0.0, 1.0), labels

    def context(self, partition: int) -> Any:
        from flwr.app import Context, RecordDict

        node_config = {"partition-id": partition, "num-partitions": self.partitions}
        return Context(run_id=0, node_id=0, node_config=node_config, state=RecordDict(), run_config=self.run_config)


def pick_split(found: Any, held_out: int, what: str) -> Any:
    """The training split (``held_out`` 0) or the held-out one (1) of what a loader returned."""
    if isinstance(found, tuple | list) and found and all(_container(x) for x in found):
        if held_out >= len(found):
            raise AuditInputError(f"{what} returns no held-out split")
        return found[held_out]
    if held_out:
        raise AuditInputError(f"{what} returns no held-out split")
    return found


def _container(x: Any) -> bool:
    """A DataLoader, a Dataset or the like: something iterated for batches or items, not an array."""
    return not hasattr(x, "shape") and (hasattr(x, "__iter__") or hasattr(x, "__getitem__"))


def to_arrays(data: Any, what: str) -> tuple[np.ndarray, np.ndarray]:
    """(images [N, C, H, W] float64, labels int64) of a DataLoader, a Dataset or an (images, labels) pair."""
    if isinstance(data, tuple | list) and len(data) == 2 and all(hasattr(x, "shape") or isinstance(x, list)
                                                                 for x in data):  # fmt: skip
        return _images_labels(*data, what=what)
    if hasattr(data, "batch_size") and hasattr(data, "dataset"):  # a DataLoader: its dataset in order, unshuffled
        from torch.utils.data import DataLoader

        ordered = DataLoader(data.dataset, batch_size=data.batch_size or 1, shuffle=False, collate_fn=data.collate_fn)
        pairs = [_pair(batch, what) for batch in ordered]
    elif hasattr(data, "__len__") and hasattr(data, "__getitem__"):  # a Dataset: its items, one image each
        pairs = [_pair(data[i], what) for i in range(len(data))]
        pairs = [(_as_numpy(x)[None], np.atleast_1d(_as_numpy(y))) for x, y in pairs]
    else:
        raise AuditInputError(f"{what} returned {type(data).__name__}, which the audit cannot read images from: "
                              "give --data")  # fmt: skip
    if not pairs:
        raise AuditInputError(f"{what} holds no images")
    images = np.concatenate([_as_numpy(x) for x, _ in pairs])
    labels = np.concatenate([np.atleast_1d(_as_numpy(y)) for _, y in pairs])
    return _images_labels(images, labels, what=what)


def _pair(item: Any, what: str) -> tuple[Any, Any]:
    """(images, labels) of one batch or item: a (x, y) pair or a dict whose image value has the most dimensions
    and whose label value is integer."""
    if isinstance(item, dict):
        arrays = {k: v for k, v in item.items() if hasattr(v, "shape") or isinstance(v, int)}
        by_rank = sorted(arrays, key=lambda k: -np.ndim(_as_numpy(arrays[k])))
        if len(by_rank) < 2:
            raise AuditInputError(f"{what}: a batch with keys {sorted(item)} has no images and labels: give --data")
        labels = [k for k in by_rank[1:] if np.issubdtype(_as_numpy(arrays[k]).dtype, np.integer)]
        if not labels:
            raise AuditInputError(f"{what}: no integer labels among the batch's keys {sorted(item)}: give --data")
        return arrays[by_rank[0]], arrays[labels[0]]
    if isinstance(item, tuple | list) and len(item) >= 2:
        return item[0], item[1]
    raise AuditInputError(f"{what}: a batch of {type(item).__name__}, neither (images, labels) nor a dict: "
                          "give --data")  # fmt: skip


def _as_numpy(x: Any) -> np.ndarray:
    if hasattr(x, "detach"):
        return x.detach().cpu().numpy()
    return np.asarray(x)


def _images_labels(images: Any, labels: Any, what: str) -> tuple[np.ndarray, np.ndarray]:
    images, labels = _as_numpy(images), _as_numpy(labels).reshape(-1)
    if images.ndim != 4 or len(images) != len(labels):
        raise AuditInputError(f"{what}: images of shape {images.shape} for {len(labels)} labels; the audit needs "
                              "[N, C, H, W]: give --data")  # fmt: skip
    if images.dtype == np.uint8:
        images = images.astype(np.float64) / 255
    return images.astype(np.float64), labels.astype(np.int64)
