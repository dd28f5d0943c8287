"""PNG plots of a run's per-round metrics."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

SERIES = {
    "accuracy": [
        ("central-accuracy", "server test set"),
        ("eval-accuracy", "clients' test splits"),
        ("train-accuracy", "train batches"),
    ],
    "loss": [
        ("central-loss", "server test set"),
        ("eval-loss", "clients' test splits"),
        ("train-loss", "train batches"),
    ],
}


def plot_history(history: list[dict[str, Any]], out_dir: Path) -> list[Path]:
    """Write accuracy.png and loss.png (one line per available metric); returns the files written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, series in SERIES.items():
        fig, ax = plt.subplots(figsize=(6, 4))
        for key, label in series:
            points = [(h["round"], h[key]) for h in history if key in h]
            if points:
                rounds, values = zip(*points, strict=True)
                ax.plot(rounds, values, marker="o", label=label)
        ax.set_xlabel("round")
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend()
        fig.tight_layout()
        path = out_dir / f"{name}.png"
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    return written
