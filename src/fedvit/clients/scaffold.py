"""The client side of SCAFFOLD (Karimireddy et al., 2020, Algorithm 1, option II): the control variate c_i.

c_i lives in the client's private folder (never sent; only Δc_i is), one file per run, so it persists across
rounds and across restarts of the client process (deployment starts a fresh process per message).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file

from fedvit.clients.state import state_dir
from fedvit.core.results import atomic_save_safetensors


def control_path(partition_id: int, run_key: str) -> Path:
    """Where partition ``partition_id`` keeps c_i for the run ``run_key`` (its run-name, else its run id)."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", run_key)
    return state_dir(partition_id) / "scaffold" / f"{safe}.safetensors"


def load_control(path: Path, shapes: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    """c_i from ``path``, or zeros (Algorithm 1: c_i starts at 0) when this client has not trained yet."""
    if not path.exists():
        return {name: np.zeros(shape, np.float32) for name, shape in shapes.items()}
    control = load_file(path)
    if {k: tuple(v.shape) for k, v in control.items()} != {k: tuple(s) for k, s in shapes.items()}:
        raise ValueError(f"{path} holds control variates for another model; delete it to start from zero")
    return control


def updated_control(
    c_local: dict[str, np.ndarray],
    c_global: dict[str, np.ndarray],
    x: dict[str, np.ndarray],
    y: dict[str, np.ndarray],
    steps: int,
    lr: float,
) -> dict[str, np.ndarray]:
    """Option II: c_i⁺ = c_i − c + (x − y) / (K · η_l), with K local steps of learning rate η_l.

    With momentum the local steps are longer than K · η_l per unit gradient; the algorithm's estimate (and so
    this one) does not correct for that.
    """
    if steps < 1:
        raise ValueError("SCAFFOLD needs at least one local step")
    scale = 1.0 / (steps * lr)
    return {
        name: (
            c_local[name].astype(np.float64) - c_global[name] + (x[name].astype(np.float64) - y[name]) * scale
        ).astype(np.float32)
        for name in c_local
    }


def save_control(path: Path, control: dict[str, np.ndarray]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_save_safetensors(path, control)
