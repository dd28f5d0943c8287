"""``fedvit audit --benchmark``: single-image client updates for every defence, made by the real client code,
attacked and scored in one go — the table and the image grid in the layout of the defence papers' Fig. 4.

Client k (of K) trains on round 1 with batch size 1, so its FedSGD update is the gradient of one image; the
same K images go through every defence. The ground truth comes from the client's ``on_batch`` hook (kept in
memory, apart from the observation); the attacks see only the payload, the model the client received and the
public config.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from attacks.audit import audit_observations, defence_of
from attacks.observation import Observation, dense_update
from clients import runner
from clients.encryption import ENCRYPTED, EncryptionKey, model_embedding_dims
from core.config import Config, parse_config
from core.data import client_data
from core.model import build_model, get_weights

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
}


def defence_config(base: Config, overrides: dict[str, Any], images: int, out: Path) -> Config:
    """The run config one defence's clients use: batch 1, K clients, ground truth on, results under ``out``."""
    values = base.to_dict() | {
        "batch-size": 1,
        "run-name": "benchmark",
        "out-dir": str(out),
        "capture.enabled": True,
        "capture.ground-truth": True,
        "capture.rounds": "1",
        "centralized-evaluation": not overrides.get("encryption.mode"),
    }
    defaults = Config().to_dict()
    values |= {k: v for k, v in defaults.items() if k.startswith(("mask.", "encryption."))}  # then this defence's
    values |= overrides
    if values["data.name"] == "synthetic":
        values["data.synthetic-train-size"] = max(values["data.synthetic-train-size"], images)
    return parse_config(values)


def client_update(config: Config, partition: int, images: int, seed_key: int) -> tuple[Observation, np.ndarray]:
    """One client's round-1 update through ``clients.runner.train``, as an attacker observes it, and its image."""
    obs, truth, _ = client_update_and_labels(config, partition, images, seed_key)
    return obs, truth


def client_update_and_labels(
    config: Config, partition: int, images: int, seed_key: int
) -> tuple[Observation, np.ndarray, np.ndarray]:
    """:func:`client_update` and the batch's true labels (for scoring the label attack; never in the observation)."""
    data_classes = client_data(config.data, config.seed, partition, images).images.num_classes
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
    records, _ = runner.train(
        config, partition, images, received, 1, config.lr, mask_seed=seed_key + partition, locked_cache={}, key=key,
        on_batch=lambda x, y: batch.update(images=x, labels=y),
    )  # fmt: skip
    update, masks = dense_update(records, {n: w.shape for n, w in public.items()})
    truth = batch["images"][0]
    meta = {"image": partition, "partition": partition, "round": 1, "label": f"image {partition}"}
    obs = Observation(
        update=update,
        received=received,
        config=config,
        num_classes=data_classes,
        masks=masks,
        known_plaintext=plain,
        known_ciphertext=cipher,
        meta=meta,
    )
    return obs, truth, batch["labels"]


def run_benchmark(base: Config, images: int, out: Path, defences: list[str] | None = None) -> list[dict]:
    """Produce, attack and score K single-image updates per defence; write audit.md/json, grid.png, fig4.png."""
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("FEDVIT_CLIENT_STATE", str(out / "client-state"))  # locked masks of these clients
    chosen = defences or list(DEFENCES)
    unknown = sorted(set(chosen) - set(DEFENCES))
    if unknown:
        raise ValueError(f"unknown defence(s) {unknown}; choose from {list(DEFENCES)}")
    items, labels = [], []
    for name in tqdm(chosen, desc="defences", unit="defence"):
        config = defence_config(base, DEFENCES[name], images, out)
        made = [client_update_and_labels(config, k, images, seed_key=1000) for k in range(images)]  # one key
        labels.extend(true_labels for _, _, true_labels in made)
        updates = [(obs, truth) for obs, truth, _ in made]
        if config.encryption.enabled:  # collusion: the attacker knows the other images and sees their updates
            updates = [
                (
                    dataclasses.replace(
                        obs, known_images=[(t, o.update) for j, (o, t) in enumerate(updates) if j != k]
                    ),
                    truth,
                )
                for k, (obs, truth) in enumerate(updates)
            ]
        items.extend(updates)
    title = f"fedvit audit benchmark: {images} images, model {base.model.name}"
    rows, attacked = audit_observations(items, out, title, true_labels=labels)
    save_figure4(attacked, rows, out / "fig4.png")
    return rows


def save_figure4(attacked: list, rows: list[dict], path: Path) -> None:
    """Rows: images; columns: original, then per defence the strongest attack's reconstruction (Fig. 4 layout)."""
    from core.plots import plt

    best: dict[tuple[int, str], tuple[float, str]] = {}
    for row in rows:
        if row["psnr"] is not None and "reference" not in row["attack"]:
            key = (row["image"], row["defence"])
            if key not in best or row["psnr"] > best[key][0]:
                best[key] = (row["psnr"], row["attack"])
    recs: dict[tuple[int, str], dict] = {}
    truths: dict[int, np.ndarray] = {}
    for obs, truth, by_attack in attacked:
        recs[(obs.meta["image"], defence_of(obs.config))] = by_attack
        truths[obs.meta["image"]] = truth
    defences = list(dict.fromkeys(defence for _, defence in recs))
    images = sorted(truths)
    fig, axes = plt.subplots(
        len(images), 1 + len(defences), figsize=(1.3 * (1 + len(defences)), 1.3 * len(images)), squeeze=False
    )
    for i, image in enumerate(images):
        axes[i, 0].imshow(np.transpose(truths[image], (1, 2, 0)))
        for j, defence in enumerate(defences, start=1):
            score = best.get((image, defence))
            if score is not None:
                axes[i, j].imshow(np.transpose(recs[(image, defence)][score[1]].image, (1, 2, 0)))
                axes[i, j].text(
                    0.5, -0.08, f"{score[0]:.0f} dB", transform=axes[i, j].transAxes, fontsize=5, ha="center", va="top"
                )
        for j in range(1 + len(defences)):
            axes[i, j].axis("off")
            if i == 0:
                axes[i, j].set_title("original" if j == 0 else defences[j - 1], fontsize=5)
    fig.suptitle("strongest attack per defence (PSNR under each image; blank: no attack could run)", fontsize=7)
    fig.tight_layout(rect=(0, 0, 1, 0.97))  # keep the title clear of the column headings
    fig.savefig(path, dpi=150)
    plt.close(fig)
