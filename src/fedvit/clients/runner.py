"""What a client does for one message, on plain dicts: the ClientApp only marshals Flower records."""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from torch import nn

from fedvit.clients.adversarial import attack_from, madry_adversary, robust_accuracy
from fedvit.clients.autoattack import autoattack_accuracy
from fedvit.clients.encryption import ENCRYPTED, EncryptionKey, EncryptionKeyError
from fedvit.clients.masking import client_seed, draw_masks, fixed_position_masks, locked_masks
from fedvit.clients.scaffold import control_path, load_control, save_control, updated_control
from fedvit.clients.training import batch_rng, evaluate, fedsgd_gradient, local_epochs
from fedvit.core.config import Config, ConfigError, autoattack_in, check_against_federation, parse_config_cached
from fedvit.core.data import DatasetUnavailableError, client_data, load_dataset
from fedvit.core.masks import encode, mask_rates
from fedvit.core.model import build_model, resolve_device, set_weights


def client_config(run_config: Mapping[str, Any]) -> Config:
    """Parse the run config once per process (cached by content)."""
    return parse_config_cached(run_config)


@functools.lru_cache(maxsize=4)
def client_model(config: Config, num_classes: int) -> nn.Module:
    """The model skeleton on the client's device; weights always come from the server."""
    structure = dataclasses.replace(config.model, pretrained="off")
    return build_model(structure, num_classes, config.seed).to(resolve_device(config.device))


def describe(config: Config, partition_id: int, num_partitions: int) -> dict[str, Any]:
    """Answer the server's discovery query: partition facts, or the config error that forbids training."""
    try:
        images = load_dataset(config.data, config.seed, "train")
        check_against_federation(config, num_partitions, len(images), images.num_classes)
        data = client_data(config.data, config.seed, partition_id, num_partitions)
    except (ConfigError, DatasetUnavailableError, ValueError) as err:
        return {"partition-id": partition_id, "error": str(err)}
    return {
        "partition-id": partition_id,
        "num-partitions": num_partitions,
        "num-train": len(data.train),
        "num-test": len(data.test),
        "num-classes": data.images.num_classes,
    }


def train(
    config: Config,
    partition_id: int,
    num_partitions: int,
    weights: dict[str, np.ndarray],
    server_round: int,
    lr: float,
    mask_seed: int | None = None,
    locked_cache: dict[str, np.ndarray] | None = None,
    key: EncryptionKey | None = None,
    proximal_mu: float = 0.0,
    server_control: dict[str, np.ndarray] | None = None,
    run_key: str = "",
    on_batch: Callable[[np.ndarray, np.ndarray], None] | None = None,
) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, float | int]]:
    """One round of local work: the FedSGD gradient (masked for masked-fedsgd) or FedAvg local epochs.

    Returns the reply's array records by name ("arrays", and "masks" when masking) and its metrics.
    ``mask_seed`` is the client's private seed (node config ``mask-seed``); ``locked_cache``
    holds locked masks between rounds (the client's context state). With a ``key`` the received
    model is decrypted before training and the update is encrypted after masking (eqs. 3, 7, 13, 14).
    ``proximal_mu`` (FedProx) and ``server_control`` (SCAFFOLD's c; the client's own c_i is kept under
    ``run_key`` in its private folder) select those local objectives; "control-delta" is then replied too.
    ``on_batch(images, labels)`` sees the images the client trained on (FedSGD: its batch; FedAvg-type: its
    partition) in [0, 1] pixels: the hook through which an audit's capture
    side records ground truth (the client itself writes nothing for attackers).
    """
    crypt_start = time.perf_counter()
    weights = key.decrypt(weights) if key is not None else weights
    crypt_s = time.perf_counter() - crypt_start
    data = client_data(config.data, config.seed, partition_id, num_partitions)
    model = client_model(config, data.images.num_classes)
    set_weights(model, weights)
    device = next(model.parameters()).device
    rng = batch_rng(config.seed, server_round, partition_id)
    img_size = _img_size(model)
    augment = config.data.augment == "crop-flip"
    adversary = None
    if config.adversarial.enabled:
        attack = attack_from(config.adversarial)
        adversary = madry_adversary(attack, config.adversarial.ratio, [config.seed, server_round, partition_id], device)
    c_local, correction, control_file = None, None, None
    if config.strategy == "scaffold":
        if server_control is None:
            raise ValueError("strategy 'scaffold' needs the server's control variate in the train message")
        control_file = control_path(partition_id, run_key)
        c_local = load_control(control_file, {name: w.shape for name, w in weights.items()})
        correction = {name: server_control[name] - c_local[name] for name in c_local}
    start = time.perf_counter()
    if config.strategy in ("fedsgd", "masked-fedsgd"):
        result = fedsgd_gradient(
            model, data.images, data.train, config.batch_size, img_size, rng, device, augment, adversary
        )
    else:
        result = local_epochs(
            model,
            data.images,
            data.train,
            epochs=config.local_epochs,
            batch_size=config.batch_size,
            lr=lr,
            momentum=config.momentum,
            img_size=img_size,
            rng=rng,
            device=device,
            augment=augment,
            adversary=adversary,
            proximal_mu=proximal_mu,
            correction=correction,
        )
    compute_s = time.perf_counter() - start
    if on_batch is not None and result.batch_indices is not None:
        x, y = data.images.batch(result.batch_indices, img_size)
        on_batch(x.numpy(), y.numpy())
    arrays, masks, extra = result.arrays, None, {}
    if config.strategy == "masked-fedsgd":
        mask_start = time.perf_counter()
        masks = client_masks(config, partition_id, server_round, arrays, mask_seed, locked_cache)
        kept = sum(int(m.sum()) for m in masks.values())
        extra = {
            "mask-s": time.perf_counter() - mask_start,
            "kept-fraction": kept / sum(m.size for m in masks.values()),
        }
    if key is not None:
        crypt_start = time.perf_counter()
        arrays = key.encrypt(arrays)
        masks = key.encrypt_masks(masks) if masks is not None else None
        extra["crypt-s"] = crypt_s + time.perf_counter() - crypt_start
    records = {"arrays": arrays}
    if c_local is not None:
        c_new = updated_control(c_local, server_control, weights, arrays, result.steps, lr)
        save_control(control_file, c_new)
        records["control-delta"] = {name: c_new[name] - c_local[name] for name in c_new}
    if masks is not None:
        mask_start = time.perf_counter()
        records["arrays"], records["masks"] = encode(arrays, masks)
        extra["mask-s"] += time.perf_counter() - mask_start
    metrics = {
        "num-examples": result.num_examples,
        "train-loss": result.loss,
        "train-accuracy": result.accuracy,
        "partition-id": partition_id,
        "compute-s": compute_s,
        **extra,
    }
    if adversary is not None:
        metrics["adversarial-samples"] = result.adversarial
    return records, metrics


def client_masks(
    config: Config,
    partition_id: int,
    server_round: int,
    gradients: dict[str, np.ndarray],
    mask_seed: int | None,
    locked_cache: dict[str, np.ndarray] | None,
) -> dict[str, np.ndarray]:
    """This round's binary weights B for every gradient entry, per the configured mask mode."""
    shapes = {name: g.shape for name, g in gradients.items()}
    if config.mask.mode == "fixed-position":
        return fixed_position_masks(shapes)
    rates = mask_rates(list(shapes), config.mask)
    seed = client_seed(partition_id, mask_seed)
    if config.mask.mode == "locked":
        return locked_masks(partition_id, seed, shapes, rates, locked_cache)
    return draw_masks(shapes, rates, seed, stream=server_round)


def evaluate_local(
    config: Config,
    partition_id: int,
    num_partitions: int,
    weights: dict[str, np.ndarray],
    key: EncryptionKey | None = None,
    server_round: int = 0,
) -> dict[str, float | int]:
    """Evaluate the received global model (decrypted first when a ``key`` is given) on this client's test split."""
    weights = key.decrypt(weights) if key is not None else weights
    data = client_data(config.data, config.seed, partition_id, num_partitions)
    model = client_model(config, data.images.num_classes)
    set_weights(model, weights)
    device = next(model.parameters()).device
    loss, accuracy, n = evaluate(model, data.test_images, data.test, _img_size(model), device)
    metrics = {"num-examples": n, "eval-loss": loss, "eval-accuracy": accuracy, "partition-id": partition_id}
    if config.robust.enabled:
        metrics["eval-robust-accuracy"] = robust_accuracy(
            model, data.test_images, data.test, _img_size(model), device, config.robust,
            [config.seed, server_round, partition_id, 2], subset_seed=config.seed,
        )  # fmt: skip
    if autoattack_in(config, server_round):
        metrics["eval-autoattack-accuracy"] = autoattack_accuracy(
            model, data.test_images, data.test, _img_size(model), config.robust,
            [config.seed, server_round, partition_id, 4], subset_seed=config.seed,
        )  # fmt: skip
    return metrics


def encrypt_initial(config: Config, key: EncryptionKey, public: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The setup handshake: the encrypted initial embeddings this client would start from.

    "paper" mode encrypts the server's public initial layers; "private-init" ignores their values and
    encrypts layers drawn from the shared secret, so the server never sees a plaintext/ciphertext pair.
    """
    if set(public) != set(ENCRYPTED):
        raise EncryptionKeyError(f"the handshake must carry exactly {list(ENCRYPTED)}, got {sorted(public)}")
    shapes = {name: a.shape for name, a in public.items()}
    key.check_shapes(shapes)
    plain = key.private_initial_embeddings(shapes) if config.encryption.mode == "private-init" else public
    return key.encrypt(plain)


def _img_size(model: nn.Module) -> int:
    return int(model.patch_embed.img_size[0])
