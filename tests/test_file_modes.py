"""Files fedvit writes get the permissions a plain ``open()`` gives under the umask; client secrets stay 0600."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import numpy as np
import pytest

from fedvit.clients.masking import client_seed, locked_masks
from fedvit.clients.state import state_dir
from fedvit.core.results import atomic_save_safetensors, atomic_write


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def umask():
    previous = os.umask(0o022)

    def set_umask(value: int) -> None:
        os.umask(value)

    yield set_umask
    os.umask(previous)


@pytest.mark.parametrize(("value", "expected"), [(0o022, 0o644), (0o027, 0o640), (0o002, 0o664)])
def test_results_follow_the_umask(tmp_path, umask, value, expected):
    umask(value)
    atomic_write(tmp_path / "metrics.json", b"{}")
    atomic_save_safetensors(tmp_path / "model.safetensors", {"w": np.zeros(3, np.float32)})
    assert mode_of(tmp_path / "metrics.json") == expected
    assert mode_of(tmp_path / "model.safetensors") == expected
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.json", "model.safetensors"]  # no temp left


def test_an_explicit_mode_wins_over_the_umask(tmp_path, umask):
    umask(0o000)
    atomic_write(tmp_path / "secret", b"x", mode=0o600)
    atomic_save_safetensors(tmp_path / "key.safetensors", {"k": np.ones(2)}, mode=0o600)
    assert mode_of(tmp_path / "secret") == mode_of(tmp_path / "key.safetensors") == 0o600


def test_client_mask_secrets_stay_private(umask):
    umask(0o000)
    client_seed(7)
    locked_masks(7, 1, {"p": (4,)}, {"p": 0.5}, {})
    files = list(state_dir(7).iterdir())
    assert {f.name.split("-")[0] for f in files} == {"mask", "locked"}
    assert all(mode_of(f) == 0o600 for f in files), [(f.name, oct(mode_of(f))) for f in files]
