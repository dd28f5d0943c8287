"""The client's private folder (mask seeds, locked masks, the default encryption key); the server never reads it."""

from __future__ import annotations

import os
from pathlib import Path

STATE_DIR_ENV = "FEDVIT_CLIENT_STATE"  # default ~/.fedvit/clients


def state_root() -> Path:
    """``$FEDVIT_CLIENT_STATE``, else ``~/.fedvit/clients`` (not created here)."""
    return Path(os.environ.get(STATE_DIR_ENV, Path.home() / ".fedvit" / "clients")).expanduser()


def state_dir(partition_id: int) -> Path:
    """One partition's private folder under :func:`state_root` (created on first use)."""
    path = state_root() / f"partition-{partition_id}"
    path.mkdir(parents=True, exist_ok=True)
    return path


PRIVATE = 0o600  # client secrets on disk (mask seed, locked masks): owner only, whatever the umask
