"""Run outputs: resolved config, per-round metrics, checkpoints, the final model and plots."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import secrets
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load_file, save

from fedvit.core.config import Config, ConfigError

STRATEGY_PREFIX = "strategy/"
# Keys that may differ between a run and its resumption.
RESUMABLE_DIFFERENCES = {"num-server-rounds", "resume-from", "run-name", "round-timeout", "device", "out-dir"}


def _new_file_beside(path: Path, mode: int = 0o666) -> tuple[int, Path]:
    """A new, empty temporary file next to ``path``, created with ``mode`` minus the process umask.

    Unlike ``tempfile.mkstemp`` (always 0600, which a rename keeps), the default gives what a plain ``open()``
    would: 0644 under umask 022, so a colleague (or the host user of a container's results) can read them.
    """
    while True:
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode), tmp
        except FileExistsError:
            continue


def atomic_write(path: Path, data: bytes, mode: int | None = None) -> None:
    """Write via a temporary file and rename, so a crash never leaves a half-written file; ``mode`` as in
    :func:`atomic_save_safetensors`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _new_file_beside(path, 0o666 if mode is None else mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    if mode is not None:
        os.chmod(tmp, mode)  # exactly ``mode``, whatever the umask
    os.replace(tmp, path)


def atomic_save_safetensors(
    path: Path, arrays: dict[str, np.ndarray], metadata: dict[str, str] | None = None, mode: int | None = None
) -> None:
    """Save arrays (and string metadata) atomically; ``mode`` sets the file's permissions (e.g. 0o600: private
    from creation on, before any byte is written), otherwise those of a plain ``open()`` under the umask."""
    # Serialised here and written through atomic_write: safetensors' save_file makes its file 0600.
    atomic_write(path, save({k: np.ascontiguousarray(v) for k, v in arrays.items()}, metadata=metadata), mode)


class RunRecorder:
    """Owns ``<out-dir>/<run-name>/``: config.json, metrics.json, checkpoints/, model.safetensors, plots/."""

    def __init__(self, root: Path, config: Config, history: list[dict[str, Any]] | None = None) -> None:
        self.root = root
        self.config = config
        self.history: list[dict[str, Any]] = history or []
        (root / "checkpoints").mkdir(parents=True, exist_ok=True)
        atomic_write(root / "config.json", json.dumps(config.to_dict(), indent=2).encode())

    def record_round(self, entry: dict[str, Any]) -> None:
        """Append one round's metrics and rewrite metrics.json."""
        self.history = [h for h in self.history if h["round"] != entry["round"]] + [entry]
        self._write_metrics()

    def amend_round(self, server_round: int, values: dict[str, Any]) -> None:
        """Add ``values`` to a recorded round's entry (metrics that arrive a round later) and rewrite metrics.json."""
        entry = next(h for h in self.history if h["round"] == server_round)
        entry.update(values)
        self._write_metrics()

    def _write_metrics(self) -> None:
        atomic_write(self.root / "metrics.json", json.dumps({"rounds": self.history}, indent=2).encode())

    def checkpoint(self, server_round: int, weights: dict[str, np.ndarray], strategy_state: dict[str, np.ndarray]):
        """Save the global model and strategy state after ``server_round``; keep the newest few."""
        arrays = dict(weights) | {STRATEGY_PREFIX + k: v for k, v in strategy_state.items()}
        ckpt_dir = self.root / "checkpoints"
        atomic_save_safetensors(ckpt_dir / f"round-{server_round:04d}.safetensors", arrays)
        atomic_write(
            ckpt_dir / f"round-{server_round:04d}.json",
            json.dumps({"round": server_round, "history": self.history}).encode(),
        )
        for old in _checkpoints(ckpt_dir)[: -self.config.checkpoint_keep]:
            old.unlink()
            old.with_suffix(".json").unlink(missing_ok=True)

    def finish(self, weights: dict[str, np.ndarray]) -> None:
        """Write the final model and the plots."""
        atomic_save_safetensors(self.root / "model.safetensors", weights)
        from fedvit.core.plots import plot_history

        plot_history(self.history, self.root / "plots")


def _checkpoints(ckpt_dir: Path) -> list[Path]:
    return sorted(p for p in ckpt_dir.glob("round-*.safetensors") if re.fullmatch(r"round-\d{4}\.safetensors", p.name))


def load_checkpoint(run_dir: Path, config: Config) -> tuple[int, dict[str, np.ndarray], dict[str, np.ndarray], list]:
    """Latest checkpoint of ``run_dir``: (round, weights, strategy state, metrics history).

    Refuses a checkpoint written with a config that differs in anything but
    :data:`RESUMABLE_DIFFERENCES`, since the result could not match an uninterrupted run.
    """
    ckpts = _checkpoints(run_dir / "checkpoints")
    if not ckpts:
        raise ConfigError("resume-from", str(run_dir), "a run directory with checkpoints/round-NNNN.safetensors")
    saved = json.loads((run_dir / "config.json").read_text())
    now = config.to_dict()
    differing = sorted(
        k for k in set(saved) | set(now) if saved.get(k) != now.get(k) and k not in RESUMABLE_DIFFERENCES
    )
    if differing:
        raise ConfigError("resume-from", str(run_dir), f"a run made with the same config (differs in {differing})")
    latest = ckpts[-1]
    meta = json.loads(latest.with_suffix(".json").read_text())
    arrays = load_file(str(latest))
    weights = {k: v for k, v in arrays.items() if not k.startswith(STRATEGY_PREFIX)}
    state = {k[len(STRATEGY_PREFIX) :]: v for k, v in arrays.items() if k.startswith(STRATEGY_PREFIX)}
    return int(meta["round"]), weights, state, meta["history"]


def trained_model(base: Config, run_dir: Path) -> Config:
    """``base`` attacking the final model of a finished run: the run's ``model.*`` settings, its weights
    (``<run>/model.safetensors``, loaded through ``model.pretrained``) as the model every client receives."""
    from fedvit.core.config import parse_config
    from fedvit.core.data import load_dataset  # data loading only when asked
    from fedvit.core.params import HEAD_BIAS

    weights, saved = run_dir / "model.safetensors", run_dir / "config.json"
    for path in (weights, saved):
        if not path.is_file():
            raise ValueError(f"--model-from {run_dir}: no {path.name} (is it the folder of a finished run?)")
    run = parse_config(json.loads(saved.read_text()))
    model = dataclasses.replace(run.model, pretrained=str(weights.resolve()))
    config = dataclasses.replace(base, model=model)
    classes = load_dataset(config.data, config.seed, "train").num_classes
    from safetensors import safe_open

    with safe_open(str(weights), "numpy") as f:
        head = f.get_slice(HEAD_BIAS).get_shape()[0] if HEAD_BIAS in f.keys() else None  # noqa: SIM118
    if head is not None and head != classes:
        raise ValueError(
            f"--model-from {run_dir}: its head has {head} classes, the benchmark's data {config.data.name!r} has "
            f"{classes} (timm would replace the trained head with a random one)"
        )
    return config
