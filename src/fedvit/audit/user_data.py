"""The client images the audit scores against: the batch fedvit's clients recorded, or the user's data (a loader or
a fedvit dataset name, and the node → partition mapping); with decoys for re-identification. Only the scoring
reads them; no path hands them to an attack."""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Any

import numpy as np

from fedvit.attacks.holdings import Auxiliary, Candidates
from fedvit.attacks.reidentification import Gallery, evenly_spaced
from fedvit.capture.reader import AuditInputError, Exchange
from fedvit.capture.writer import FEDVIT_SWITCH
from fedvit.core.budget import DEFAULT_DECOYS
from fedvit.core.config import Config, is_dataset_name, parse_config_cached
from fedvit.observed.model_spec import import_callable
from fedvit.observed.observation import Observation, input_shape, recipe


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
    canaries: str | None = None  # package.module:loader, loader(partition_id) -> (images, labels, included)
    loader: Any = dataclasses.field(default=None, compare=False, repr=False)  # a callable in place of ``source``'s
    _loaded: dict[int, tuple[np.ndarray, np.ndarray]] = dataclasses.field(
        default_factory=dict, compare=False, repr=False
    )

    @property
    def named(self) -> bool:
        return is_dataset_name(self.source)

    def config(self) -> Any:
        """The fedvit Config of a named dataset (its errors name the key that is wrong)."""
        from fedvit.core.config import ConfigError, parse_config

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
                loader = self.loader or import_callable(self.source, self.app_dir, "--data")
                try:
                    found = loader(partition)
                except Exception as err:  # the user's loader failed: one line, not its traceback
                    first = str(err).splitlines()[0] if str(err) else ""
                    raise AuditInputError(f"--data {self.source}({partition}) raised {type(err).__name__}: {first} "
                                          f"(the audit calls it with a partition id; {EXPECTED})") from err  # fmt: skip
                if not isinstance(found, tuple | list) or len(found) != 2:
                    raise AuditInputError(f"--data {self.source}({partition}) returned {type(found).__name__}; "
                                          f"{EXPECTED}")  # fmt: skip
                images, labels = found
            self._loaded[partition] = normalized(images, labels, f"--data {self.source}({partition})")
        return self._loaded[partition]

    def planted(self, partition: int) -> Candidates:
        """The canaries planted in partition ``partition``'s training as membership candidates: members the ones
        it included, non-members the ones it left out (each in with probability ½, Steinke et al., arXiv
        2305.08846)."""
        found = import_callable(self.canaries, self.app_dir, "--canaries")(partition)
        what = f"--canaries {self.canaries}({partition})"
        if not isinstance(found, tuple) or len(found) != 3:
            raise AuditInputError(f"{what} returned {type(found).__name__}: expected (images, labels, included)")
        images, labels = normalized(found[0], found[1], what)
        included = np.asarray(found[2])
        if included.dtype != bool or included.shape != labels.shape:
            raise AuditInputError(f"{what}: included must be {len(labels)} booleans (one per canary), got "
                                  f"{_described(found[2])}")  # fmt: skip
        if included.all() or not included.any():
            raise AuditInputError(f"{what}: every canary is {'in' if included.all() else 'out'}: none to compare")
        return Candidates((images[included], labels[included]), (images[~included], labels[~included]),
                          f"{int((~included).sum())} canaries left out of {len(included)} planted ({self.canaries})",
                          canaries=True)  # fmt: skip

    def _named_partition(self, partition: int, count: int | None) -> tuple[np.ndarray, np.ndarray]:
        from fedvit.core.data import DatasetUnavailableError, client_data

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


EXPECTED = (
    "expected (images, labels): images [N, C, H, W] or [N, H, W, C] (C = 1 or 3), float in [0, 1] or uint8 in "
    "0-255, NumPy or torch; N integer labels"
)


def _described(value: Any) -> str:
    """What a loader returned, in a few words: type, dtype, shape and value range."""
    shape = tuple(getattr(value, "shape", ()) or ())
    dtype = getattr(value, "dtype", None)
    text = f"{type(value).__module__.split('.')[0]}.{type(value).__name__}"
    if dtype is not None:
        text += f" {dtype} {list(shape)}"
        try:
            array = np.asarray(value.detach().cpu() if hasattr(value, "detach") else value, dtype=np.float64)
            text += f" in [{array.min():.3g}, {array.max():.3g}]" if array.size else ""
        except (TypeError, ValueError):
            pass
    return text


def normalized(images: Any, labels: Any, what: str) -> tuple[np.ndarray, np.ndarray]:
    """The one boundary for the user's data: whatever a loader returns (NumPy or torch, any strides, ``uint8`` in
    0-255 or float in [0, 1], ``[N, C, H, W]`` or ``[N, H, W, C]``, labels as a list, array or tensor) becomes
    C-contiguous float64 ``[N, C, H, W]`` in [0, 1] and int64 labels ``[N]``, so no model meets a memory layout it
    does not tolerate; anything else is refused in one line that says what was received."""

    def refused(why: str) -> AuditInputError:  # described only on refusal: the range reads every pixel
        return AuditInputError(f"{what} returned images {_described(images)}, labels {_described(labels)}{why}; "
                               f"{EXPECTED}")  # fmt: skip

    try:
        array = np.asarray(images.detach().cpu() if hasattr(images, "detach") else images)
        targets = np.asarray(labels.detach().cpu() if hasattr(labels, "detach") else labels)
    except (TypeError, ValueError) as err:
        raise refused(f": not arrays ({err})") from None
    if array.ndim != 4 or targets.ndim != 1 or len(targets) != len(array) or not len(array):
        raise refused("")
    if array.shape[1] not in (1, 3) and array.shape[-1] in (1, 3):  # channels last
        array = array.transpose(0, 3, 1, 2)
    if array.dtype == np.uint8:
        array = array / 255.0
    elif not np.issubdtype(array.dtype, np.floating):
        raise refused(f": {array.dtype} pixels")
    if not np.issubdtype(targets.dtype, np.integer):
        raise refused(f": {targets.dtype} labels")
    array = np.ascontiguousarray(array, dtype=np.float64)
    if array.min() < 0 or array.max() > 1:
        hint = (" (normalised? return pixels in [0, 1]: the audit applies the model's mean/std)" if array.min() < 0
                else " (0-255 as floats? divide by 255)" if array.max() <= 255 else "")  # fmt: skip
        raise refused(f": pixels outside [0, 1]{hint}")
    return array, np.ascontiguousarray(targets, dtype=np.int64)


def gallery_for(data: UserData, own: frozenset[int], size: tuple[int, ...],
                held: frozenset[int] = frozenset()) -> Gallery:  # fmt: skip
    """Decoys for the partitions ``own`` (one client's, or an aggregate's): a named dataset's test split (99
    images), else every image of the other partitions (mapped, ``held`` by the audited updates, and decoy), at
    most 99."""
    if data.named:  # the same decoys for every partition
        return gallery_from_test_split(data.config(), int(size[-1]))
    decoys = []
    for pid in sorted(set(data.partitions.values()) | held | set(data.decoy_partitions)):
        if pid not in own:
            images = data.load(pid)[0]
            decoys.extend(im for im in images if im.shape == tuple(size))
    decoys = decoys[:DEFAULT_DECOYS]
    stacked = np.stack(decoys) if decoys else np.zeros((0, *size))
    return Gallery(stacked, f"{len(decoys)} images of other partitions ({data.source})")


OTHERS = 5000  # images of others (partitions not the client's, a test split) the attacker simulates or compares with


@functools.lru_cache(maxsize=4)
def test_split_sample(config: Config, size: int, count: int = OTHERS) -> tuple[np.ndarray, np.ndarray]:
    """``count`` evenly spaced images [n, C, H, W] in [0, 1] and labels of the run dataset's test split."""
    from fedvit.core.data import load_dataset

    images = load_dataset(config.data, config.seed, "test")
    indices = evenly_spaced(len(images), count)
    x, y = images.batch(indices, size)
    return x.numpy().astype(np.float64), y.numpy().astype(np.int64)


def others(data: UserData, own: frozenset[int],
           held: frozenset[int] = frozenset()) -> tuple[np.ndarray, np.ndarray, str] | None:  # fmt: skip
    """Images none of which is of the partitions ``own``: the decoy partitions (else the other partitions mapped or
    ``held`` by the audited updates) of a loader, a named dataset's test split; at most :data:`OTHERS`, evenly
    spaced."""
    if data.named:
        x, y = test_split_sample(data.config(), data.image_size)
        return x, y, f"{len(x)} images of the {data.source} test split"
    pids = sorted(set(data.decoy_partitions) - own) or sorted((set(data.partitions.values()) | held) - own)
    if not pids:
        return None
    loaded = [data.load(p) for p in pids]
    x, y = np.concatenate([a for a, _ in loaded]), np.concatenate([b for _, b in loaded])
    keep = evenly_spaced(len(x), OTHERS)
    return x[keep], y[keep], f"{len(keep)} images of {partitions_text(pids)} ({data.source})"


def partitions_text(pids: list[int]) -> str:
    """"partition 4", "partitions 4-7" (a run), "partitions 1, 5" (not a run)."""
    if len(pids) == 1:
        return f"partition {pids[0]}"
    run = pids == list(range(pids[0], pids[-1] + 1))
    return f"partitions {pids[0]}-{pids[-1]}" if run else "partitions " + ", ".join(map(str, pids))


class Truths:
    """The images an update is scored against (``--data``'s partition, else the recorded batch) and the decoys."""

    def __init__(self, data: UserData | None, decoys: int, gallery: Gallery | None = None) -> None:
        self.data, self.decoys, self.gallery = data, decoys, gallery  # ``gallery``: the same decoys for every update
        self.galleries: list[Gallery] = []
        self.notes: list[str] = []
        self._others: dict[Any, tuple[np.ndarray, np.ndarray, str] | None] = {}  # by partition (or run config)
        self.held: frozenset[int] = frozenset()  # the partitions of every audited update (:meth:`hold`)
        # a SecAgg+ aggregate's members: (client name, [start, stop) of its images in the scored truth), by update
        self.slices: dict[str, list[tuple[str, int, int]]] = {}

    def hold(self, exchanges: list[Exchange]) -> None:
        """Note the partitions every audited update trained on (``--partition`` or the capture's partition ids):
        with no decoy partitions, each client's others are the other clients' partitions."""
        if self.data is not None:
            self.held = frozenset().union(*(self.partitions_of(ex, quiet=True) or () for ex in exchanges))

    def of(self, ex: Exchange, obs: Observation) -> tuple[np.ndarray | None, np.ndarray | None, Gallery | None, bool]:
        """(images, labels, gallery, exact): ``exact`` when the images are exactly the update's."""
        data = self.data
        if data is not None:
            own = self.partitions_of(ex)
            if own is None:
                return None, None, None, False
            loaded = [data.load(p, ex.num_partitions) for p in sorted(own)]
            images, labels = np.concatenate([x for x, _ in loaded]), np.concatenate([y for _, y in loaded])
            if images.shape[1:] != tuple(input_shape(obs)):  # the model would be fed what it was not built for
                raise AuditInputError(
                    f"--data {data.source} gives images {list(images.shape[1:])} (C, H, W), the model takes "
                    f"{list(input_shape(obs))} (--input): resize in the loader, or give --input to match")
            gallery = gallery_for(data, own, images.shape[1:], self.held)
            exact = len(images) == recipe(obs).examples
            what = partitions_text(sorted(own))
            if not exact:  # which of the partition's images the update used is unknown
                self.notes.append(
                    f"{ex.label}: {what} holds {len(images)} images, the update {recipe(obs).examples}: "
                    "each reconstruction is scored against its closest partition image (optimistic); labels unscored"
                )
            if not ex.members:
                obs.meta["partition"] = next(iter(own))
            else:
                self._slice(ex, [f"partition {p}" for p in sorted(own)], [len(y) for _, y in loaded])
            return self._keep(images, labels, gallery, exact)
        recorded = ex.ground_truth()
        if recorded is None:
            return None, None, None, False
        images = np.asarray(recorded["images"])
        if ex.members:  # the members' recorded batches, in member order (``Exchange.ground_truth``)
            partitions, examples = ex.meta.get("member-partitions", {}), ex.meta.get("member-examples", {})
            names = [f"partition {partitions[str(n)]}" if partitions.get(str(n)) is not None else f"node {n}"
                     for n in ex.members]  # fmt: skip
            sizes = [examples.get(str(n)) for n in ex.members]
            if None not in sizes and sum(sizes) == len(images):
                self._slice(ex, names, sizes)
        return self._keep(images, np.asarray(recorded["labels"]), self._gallery_of(ex, images), True)

    def _slice(self, ex: Exchange, names: list[str], sizes: list[int]) -> None:
        bounds = np.cumsum([0, *sizes])
        self.slices[ex.label] = [(n, int(a), int(b)) for n, a, b in zip(names, bounds[:-1], bounds[1:], strict=True)]

    def others(self, ex: Exchange, obs: Observation) -> tuple[np.ndarray, np.ndarray, str] | None:
        """Labelled images that are not this client's (auxiliary data for the label simulation, non-members for
        membership): see :func:`others`; for a fedvit run without ``--data``, its test split (None if not loadable).
        Gathered once per partition (or run config) and audit."""
        key = self.partitions_of(ex, quiet=True) if self.data is not None else run_config(ex)
        if key not in self._others:
            self._others[key] = self._gather_others(key, obs)
        return self._others[key]

    def _gather_others(self, key: Any, obs: Observation) -> tuple[np.ndarray, np.ndarray, str] | None:
        if self.data is not None:
            return None if key is None else others(self.data, key, self.held)
        if key is None:
            return None
        try:
            x, y = test_split_sample(key, int(input_shape(obs)[-1]))
        except (OSError, RuntimeError, ValueError):
            return None
        return x, y, f"{len(x)} images of the {key.data.name} test split"

    def auxiliary(self, ex: Exchange, obs: Observation) -> Auxiliary | None:
        """:meth:`others` as the label simulation's auxiliary data (None: the simulation uses noise)."""
        found = self.others(ex, obs)
        return None if found is None else Auxiliary(*found)

    def candidates(self, ex: Exchange, obs: Observation, members: np.ndarray | None,
                   labels: np.ndarray | None) -> Candidates | None:  # fmt: skip
        """Membership candidates: the client's images (the scored truth) and :meth:`others` (None if either lacks);
        with ``--canaries``, the canaries planted in its partition instead."""
        if self.data is not None and self.data.canaries is not None:
            own = self.partitions_of(ex, quiet=True)
            return None if own is None or len(own) != 1 else self.data.planted(next(iter(own)))
        found = None if members is None or labels is None else self.others(ex, obs)
        return None if found is None else Candidates((members, labels), found[:2], found[2])

    def partitions_of(self, ex: Exchange, quiet: bool = False) -> frozenset[int] | None:
        """The partitions an update trained on as ``--data`` maps its node (a SecAgg+ aggregate: its members'),
        else the node config's; None (and a note, unless ``quiet``) where one is unknown."""
        nodes = ex.members or (ex.node,)
        recorded = ex.meta.get("member-partitions", {}) if ex.members else {str(ex.node): ex.partition}
        found = {n: self.data.partitions.get(str(n), recorded.get(str(n))) for n in nodes}
        missing = [str(n) for n, p in found.items() if p is None]
        if missing:
            if not quiet:
                self.notes.append(f"{ex.label}: no partition known for node {', '.join(missing)} (give --partition "
                                  "NODE=ID): unscored")  # fmt: skip
            return None
        return frozenset(int(p) for p in found.values())

    def _keep(self, images, labels, gallery, exact):
        if gallery is not None and all(gallery is not g for g in self.galleries):
            self.galleries.append(gallery)
        return images, labels, gallery, exact

    def _gallery_of(self, ex: Exchange, images: np.ndarray) -> Gallery | None:
        """Decoys from the test split of a fedvit run's dataset (None when off or not loadable here, said once)."""
        config = run_config(ex)
        if self.gallery is not None or self.decoys <= 0 or config is None:
            return self.gallery
        try:
            return gallery_from_test_split(config, int(images.shape[-1]), self.decoys)
        except (OSError, RuntimeError, ValueError) as err:
            note = f"re-identification not scored: the run's test split cannot be loaded ({err})"
            if note not in self.notes:
                logging.getLogger("fedvit.audit").info(f"audit: {note}")
                self.notes.append(note)
            return None


@functools.lru_cache(maxsize=4)
def gallery_from_test_split(config: Config, size: int, count: int = DEFAULT_DECOYS) -> Gallery:
    """``count`` decoys from the test split of the run's dataset at ``size`` px (an evenly spaced, fixed selection;
    fewer when the split is smaller; built once per config). Raises the dataset's own error when it cannot be
    loaded."""
    from fedvit.core.data import load_dataset

    images = load_dataset(config.data, config.seed, "test")
    if count < 1:
        raise ValueError(f"the re-identification gallery needs at least one decoy, got {count}")
    indices = evenly_spaced(len(images), count)
    x, _ = images.batch(indices, size)
    return Gallery(x.numpy().astype(np.float64), f"{len(indices)} images of the {config.data.name} test split")


def run_config(ex: Exchange) -> Config | None:
    """The parsed run config of a capture of fedvit's own app (None: another app's, or one that does not parse)."""
    if FEDVIT_SWITCH not in ex.run_config:
        return None
    try:
        return parse_config_cached(ex.run_config)
    except ValueError:
        return None
