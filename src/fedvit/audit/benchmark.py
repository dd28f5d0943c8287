"""``fedvit audit --benchmark``: client updates for every defence and setting (batch size; FedSGD or FedAvg with
E local steps), made by the real client code, written as captures and audited through the one pipeline
(:mod:`fedvit.audit.pipeline`); plus the image grid of the defence papers' Fig. 4 (single-image FedSGD).

Client k trains round 1 on its partition of steps·B images; each defence and setting is a run of its own, with
the clients' ground truth beside the captures. Under encryption the attacker also knows colluding clients'
images and single-image updates (``colluders/<defence>/``, named in the manifests).
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from fedvit.audit.frontier import write_frontier
from fedvit.audit.metrics import as_batch
from fedvit.audit.pipeline import AuditOptions, Reader, audit_exchanges
from fedvit.audit.registry import MeasureOptions
from fedvit.audit.report import draw_grid
from fedvit.audit.user_data import gallery_from_test_split
from fedvit.capture.reader import load_exchanges
from fedvit.capture.writer import capture_stem, direction_entry, write_direction, write_ground_truth
from fedvit.clients import runner
from fedvit.clients.encryption import ENCRYPTED, EncryptionKey, model_embedding_dims
from fedvit.clients.privacy import privatize_offline
from fedvit.core.budget import DEFAULT_DECOYS, check_decoys
from fedvit.core.config import Config, parse_config
from fedvit.core.data import client_data, load_dataset
from fedvit.core.model import build_model, get_weights
from fedvit.observed.observation import Observation

DEFENCES: dict[str, dict[str, Any]] = {
    "plain": {"strategy": "fedsgd"},
    "fixed-position": {"strategy": "masked-fedsgd", "mask.mode": "fixed-position"},
    **{
        f"mask-{mode}-r{r:g}": {"strategy": "masked-fedsgd", "mask.mode": mode, "mask.r": r}
        for mode in ("fresh", "locked")
        for r in (0.2, 0.5, 0.8)
    },
    "encryption-paper": {"strategy": "fedsgd", "encryption.mode": "paper"},
    "encryption-private-init": {"strategy": "fedsgd", "encryption.mode": "private-init"},
    "pgd-at": {"strategy": "fedsgd", "adversarial.enabled": True},
    "dp-central": {"strategy": "fedsgd", "dp.mode": "central", "dp.noise-multiplier": 1.0},
    **{
        f"dp-local-{sigma:g}": {"strategy": "fedsgd", "dp.mode": "local", "dp.noise-multiplier": sigma}
        for sigma in (0.001, 0.01)
    },
}
GRADIENT_ONLY = ("masked-fedsgd",)  # strategies that exist only as FedSGD (no FedAvg form)


@dataclass(frozen=True)
class Setting:
    """What one client does per update: ``steps`` = 1 is FedSGD (one gradient of a batch of ``batch``);
    ``steps`` > 1 is FedAvg with that many local SGD steps of ``batch`` images (one local epoch)."""

    batch: int
    steps: int = 1

    @property
    def label(self) -> str:
        return f"B={self.batch}" + (f", FedAvg {self.steps} steps" if self.steps > 1 else ", FedSGD")


def defence_config(
    base: Config, overrides: dict[str, Any], updates: int, out: Path, setting: Setting = Setting(1)
) -> Config:
    """The run config one defence's clients use in ``setting``: ``updates`` clients of ``steps·batch`` images
    each (IID, trained whole: ``data.client-eval = "test-shard"``), ground truth on, results under ``out``."""
    values = base.to_dict() | {
        "batch-size": setting.batch,
        "run-name": "benchmark",
        "out-dir": str(out),
        "capture.enabled": True,
        "capture.ground-truth": True,
        "capture.rounds": "1",
        "centralized-evaluation": not overrides.get("encryption.mode"),
        "data.partitioner": "iid",
        "data.client-eval": "test-shard",
    }
    defaults = Config().to_dict()
    values |= {k: v for k, v in defaults.items() if k.startswith(("mask.", "encryption.", "adversarial.", "dp."))}
    values |= overrides
    if setting.steps > 1:
        if values["strategy"] in GRADIENT_ONLY:
            raise ValueError(f"strategy {values['strategy']!r} exists only as FedSGD")
        values |= {"strategy": "fedavg", "local-epochs": 1, "momentum": 0.0}
    if values["data.name"] == "synthetic":
        values["data.synthetic-train-size"] = updates * setting.steps * setting.batch
    return parse_config(values)


def partitions(config: Config, setting: Setting, updates: int) -> int:
    """How many clients share the data so that each holds ``steps·batch`` images (at least ``updates``)."""
    train = len(load_dataset(config.data, config.seed, "train"))
    count = train // (setting.steps * setting.batch)
    if count < updates:
        raise ValueError(
            f"{config.data.name}: {train} training images hold {count} client(s) of {setting.steps}×{setting.batch} "
            f"images, fewer than the {updates} update(s) asked for"
        )
    return count


def write_client_update(
    root: Path, run_id: int, config: Config, partition: int, num_partitions: int, seed_key: int, meta: dict[str, Any]
) -> None:
    """One client's round-1 update through ``fedvit.clients.runner.train``, captured as on its link (node
    ``partition + 1``; in ``paper`` encryption mode with round 0's handshake), its true batch beside it."""
    data_classes = client_data(config.data, config.seed, partition, num_partitions).images.num_classes
    model = build_model(config.model, data_classes, config.seed)
    public = get_weights(model)
    received, key, plain, cipher = public, None, None, None
    if config.encryption.enabled:
        patch_dim, n1 = model_embedding_dims(model)
        key = EncryptionKey.generate(patch_dim, n1 - 1, seed=seed_key)  # the clients' secret, not the attacker's
        start = public | (
            key.private_initial_embeddings({n: public[n].shape for n in ENCRYPTED})
            if config.encryption.mode == "private-init"
            else {}
        )
        received = key.encrypt(start)
        if config.encryption.mode == "paper":  # the server's own initial model and the clients' answer
            plain, cipher = {n: public[n] for n in ENCRYPTED}, {n: received[n] for n in ENCRYPTED}
    batch: dict[str, np.ndarray] = {}
    records, metrics = runner.train(
        config, partition, num_partitions, received, 1, config.lr, mask_seed=seed_key + partition, locked_cache={},
        key=key, on_batch=lambda x, y: batch.update(images=x, labels=y),
    )  # fmt: skip
    if config.dp.enabled:  # through Flower's DP mod, as the ClientApp's dp_mod does
        records, metrics = privatize_offline(config, received, records, metrics, config.lr)
    node = partition + 1
    head = {"run-id": run_id, "round": 1, "node": node, "partition": partition, "observer": "benchmark",
            "run_config": config.to_dict(), "meta": meta}  # fmt: skip
    stem = capture_stem(root, run_id, 1, node, "train")
    write_direction(stem, "received", *_direction("train", {"arrays": received}, config={"server-round": 1}), **head)
    write_direction(stem, "sent", *_direction("train", records, metrics=metrics), **head)
    write_ground_truth(root, run_id, 1, node, batch["images"], batch["labels"])
    if plain is not None:
        stem = capture_stem(root, run_id, 0, node, "query")
        head = head | {"round": 0}
        write_direction(stem, "received", *_direction("query", {"arrays": plain}), **head)
        write_direction(stem, "sent", *_direction("query", {"arrays": cipher}), **head)


def observed_update(
    config: Config, partition: int, num_partitions: int, seed_key: int, root: Path
) -> tuple[Observation, np.ndarray, np.ndarray]:
    """One client's update as the audit observes it (written under ``root`` and read back through the audit's
    reader), with the images and labels it trained on (for scoring; never in the observation)."""
    write_client_update(root, 1, config, partition, num_partitions, seed_key, {})
    exchanges, _ = load_exchanges(root)
    (ex,) = [e for e in exchanges if e.partition == partition and e.run_id == 1]
    truth = ex.ground_truth()
    return Reader(AuditOptions()).observe(ex), truth["images"], truth["labels"]


def client_update_and_labels(
    config: Config, partition: int, num_partitions: int, seed_key: int
) -> tuple[Observation, np.ndarray, np.ndarray]:
    """:func:`observed_update` through a temporary capture folder (the arrays are read into memory)."""
    with tempfile.TemporaryDirectory(prefix="fedvit-update-") as tmp:
        return observed_update(config, partition, num_partitions, seed_key, Path(tmp))


def _direction(
    message_type: str,
    records: dict[str, dict[str, np.ndarray]],
    config: dict | None = None,
    metrics: dict | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Records as one direction of a capture: the flattened arrays and the manifest entry."""
    arrays = {f"{record}/{name}": np.asarray(a) for record, named in records.items() for name, a in named.items()}
    configs, metric_records = ({"config": config} if config else {}), ({"metrics": metrics} if metrics else {})
    return arrays, direction_entry(message_type, arrays, configs, metric_records)


def dataset_mean_image(config: Config, size: int) -> np.ndarray:
    """The mean training image in [0, 1] at ``size`` px (a no-information reference an attacker could compute from
    public data)."""
    images = load_dataset(config.data, config.seed, "train")
    total = None
    for start in range(0, len(images), 256):
        x, _ = images.batch(np.arange(start, min(start + 256, len(images))), size)
        total = x.sum(0) if total is None else total + x.sum(0)
    return (total / len(images)).numpy().astype(np.float64)


def run_benchmark(
    base: Config,
    images: int,
    out: Path,
    defences: list[str] | None = None,
    settings: list[Setting] | None = None,
    accuracy: dict[str, float] | None = None,
    decoys: int = DEFAULT_DECOYS,
    budgets: list[int] | None = None,
    keep: Path | None = None,
) -> list[dict]:
    """``images`` client updates per defence and setting as captures (under ``keep``, else a temporary folder),
    audited; writes the audit's files, fig4.png and the frontier (``accuracy``: final accuracy per defence from
    short training runs). ``decoys``: test-split re-identification decoys (0: off); ``budgets``: Adam steps."""
    check_decoys(decoys)
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("FEDVIT_CLIENT_STATE", str(out / "client-state"))  # locked masks of these clients
    chosen = defences or list(DEFENCES)
    unknown = sorted(set(chosen) - set(DEFENCES))
    if unknown:
        raise ValueError(f"unknown defence(s) {unknown}; choose from {list(DEFENCES)}")
    settings = settings or [Setting(1)]
    with tempfile.TemporaryDirectory(prefix="fedvit-benchmark-") as tmp:
        root = Path(keep) if keep is not None else Path(tmp)
        skipped = write_updates(base, images, out, root, chosen, settings)
        for note in skipped:
            print(f"audit benchmark: skipped {note}", flush=True)
        exchanges, _ = load_exchanges(root / "updates")
        weights = "random init" if base.model.pretrained == "off" else f"weights {base.model.pretrained}"
        title = (
            f"fedvit audit benchmark: {images} update(s) per defence and setting, model {base.model.name} ({weights})"
        )
        size = base.model.img_size
        if exchanges:
            size = int(exchanges[0].ground_truth()["images"].shape[-1])
        options = AuditOptions(
            decoys=decoys,
            measures=MeasureOptions(budgets=None if budgets is None else tuple(budgets)),
            title=title,
            dataset_mean=dataset_mean_image(base, size) if exchanges else None,
            gallery=gallery_from_test_split(base, size, decoys) if decoys > 0 else None,
        )
        report, _, attacked = audit_exchanges(exchanges, out, options)
        if keep is not None:
            print(f"audit benchmark: captures kept in {keep}", flush=True)
    rows = report["rows"]
    single = [a for a in attacked if a.obs.meta.get("setting") == Setting(1).label]
    if single:
        save_figure4(single, [r for r in rows if r.get("setting") == Setting(1).label], out / "fig4.png")
    write_frontier(rows, out, accuracy or {}, skipped)
    return rows


def write_updates(
    base: Config, images: int, out: Path, root: Path, chosen: list[str], settings: list[Setting]
) -> list[str]:
    """Every defence × setting as a run of ``images`` captured client updates under ``root/updates`` (and the
    colluders of the encrypted defences under ``root/colluders``); returns the cases skipped, with why."""
    skipped = []
    cases = [(name, setting) for setting in settings for name in chosen]
    for run_id, (name, setting) in enumerate(tqdm(cases, desc="defences × settings", unit="case"), start=1):
        try:
            config = defence_config(base, DEFENCES[name], images, out, setting)
        except ValueError as err:
            skipped.append(f"{name} at {setting.label}: {err}")
            continue
        count = partitions(config, setting, images)
        meta = {"defence-name": name, "setting": setting.label, "batch-size": setting.batch,
                "local-steps": setting.steps}  # fmt: skip
        if config.encryption.enabled:  # collusion: the attacker knows other images and their single-image updates
            meta["colluders"] = str(_write_colluders(base, name, images, out, root))
        for k in range(images):  # one key for every client of the case
            write_client_update(root / "updates", run_id, config, k, count, 1000, meta | {"image": k,
                                "label": f"client {k}"})  # fmt: skip
    return skipped


def _write_colluders(base: Config, name: str, images: int, out: Path, root: Path) -> Path:
    """What colluding clients give the attacker under an encryption defence: their own image and the single-image
    (B = 1, FedSGD) update each sent under the same key, for clients 0..images−1 (written once per defence)."""
    folder = root / "colluders" / name
    if not folder.is_dir():
        config = defence_config(base, DEFENCES[name], images, out, Setting(1))
        count = partitions(config, Setting(1), images)
        for j in range(images):
            write_client_update(folder, 1, config, j, count, 1000, {})
    return folder


def save_figure4(attacked: list, rows: list[dict], path: Path) -> None:
    """Rows: images; columns: original, then per defence the strongest attack's reconstruction (Fig. 4 layout)."""
    best: dict[tuple[int, str], tuple[float, str]] = {}
    for row in rows:
        if row["psnr"] is not None and "reference" not in row["attack"]:
            key = (row["image"], row["defence"])
            if key not in best or row["psnr"] > best[key][0]:
                best[key] = (row["psnr"], row["attack"])
    panels: dict[int, tuple] = {}
    for item in attacked:
        image, defence = item.obs.meta["image"], item.obs.defence.name
        label, truth, recs, captions = panels.setdefault(image, (f"client {image}", as_batch(item.truth)[0], {}, {}))
        if (image, defence) in best:
            psnr, attack = best[(image, defence)]
            recs[defence], captions[defence] = item.reconstructions[attack].image, f"{psnr:.0f} dB"
    defences = list(dict.fromkeys(item.obs.defence.name for item in attacked))
    title = "strongest attack per defence (PSNR under each image; blank: no attack could run)"
    draw_grid([panels[k] for k in sorted(panels)], defences, path, title, dpi=150)
