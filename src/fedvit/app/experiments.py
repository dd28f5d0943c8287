"""Experiment runner: several ``flwr run``s that differ in a few keys, then one table and one figure."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedvit.app.run_config import check_config, merge_overrides, resolved_run_config, write_overrides


@dataclass(frozen=True)
class Experiment:
    """A comparison: shared run config, one override set per method, and the federation to run on."""

    name: str
    base: tuple[str, ...]  # preset files shared by every method (relative to the app dir)
    methods: dict[str, str]  # label -> key=value overrides
    federation: str
    update_counts: tuple[str, ...] = ()  # labels whose update-count histograms go into one figure
    grid: dict[str, dict[str, str]] = field(default_factory=dict)  # axis -> value label -> overrides


GRID_SEPARATOR = "."  # method label of a grid cell: "<value>.<value>..." in axis order


def grid_methods(grid: dict[str, dict[str, str]]) -> dict[str, str]:
    """Every combination of the grid's axes: label "a.b.c" -> the axes' overrides joined."""
    for axis, values in grid.items():
        bad = [v for v in values if GRID_SEPARATOR in v or "/" in v]
        if not values or bad:
            raise ValueError(f"grid axis {axis!r}: needs values whose labels have no '.' or '/' (got {bad})")
    return {
        GRID_SEPARATOR.join(label for label, _ in cell): " ".join(overrides for _, overrides in cell)
        for cell in itertools.product(*(values.items() for values in grid.values()))
    }


def load_experiment(path: Path) -> Experiment:
    """Read an experiment file (see ``conf/experiments/``); relative preset paths resolve from the app dir.

    ``[experiment.methods]`` lists runs by label; ``[experiment.grid.<axis>]`` tables instead span every
    combination of their values (e.g. partition × aggregator × training).
    """
    spec = tomllib.loads(path.read_text())["experiment"]
    grid = {axis: dict(values) for axis, values in spec.get("grid", {}).items()}
    methods = dict(spec.get("methods", {})) | grid_methods(grid) if grid else dict(spec["methods"])
    return Experiment(
        name=spec["name"],
        base=tuple(spec.get("base", [])),
        methods=methods,
        federation=spec.get("federation", "num-supernodes=5 client-resources-num-cpus=1"),
        update_counts=tuple(spec.get("update-counts", [])),
        grid=grid,
    )


def run_experiment(exp: Experiment, app_dir: Path, out_root: Path, extra: list[str]) -> Path:
    """Run every method (skipping finished ones), then write ``summary.md``/``summary.json`` and the plots."""
    out = (out_root / exp.name).resolve()
    out.mkdir(parents=True, exist_ok=True)
    for i, (label, overrides) in enumerate(exp.methods.items(), 1):
        run_config = [str(method_config(exp, app_dir, out, label, [*extra, overrides]))]
        if check_config(app_dir, run_config):
            raise SystemExit(2)
        _ensure_key(app_dir, run_config)
        if (out / label / "model.safetensors").exists():
            print(f"[{exp.name}] {label}: already done, reusing {out / label}", flush=True)
            continue
        print(f"[{exp.name}] {label} ({i}/{len(exp.methods)}): running", flush=True)
        cmd = [sys.executable, "-m", "fedvit.app.cli", "run", str(app_dir), "--federation-config", exp.federation]
        for part in run_config:
            cmd += ["-c", part]
        if subprocess.run(cmd).returncode != 0:
            raise SystemExit(f"[{exp.name}] {label} failed; fix it and rerun (finished methods are kept)")
    if exp.grid:
        from fedvit.app.fat_report import write_fat_report

        summary = write_fat_report(out, exp.grid)
        print(summary + _config_note(out / "fat-table.md"), flush=True)
        return out
    summary = summarize(out, list(exp.methods))
    plot_accuracy(out, list(exp.methods))
    if exp.update_counts:
        from fedvit.strategies.update_counts import plot_update_counts

        reports = {
            label: json.loads((out / label / "update-counts.json").read_text())
            for label in exp.update_counts
            if (out / label / "update-counts.json").exists()
        }
        plot_update_counts(reports, out / "update-counts.png")
    print(summary + _config_note(out / "summary.md"), flush=True)
    return out


def _config_note(report: Path) -> str:
    """Say in the report where each run's effective config is (what the run really used, every override merged)."""
    note = (
        "\nEach run's effective config (defaults, presets, `-c` overrides, then the method's own keys, merged key by "
        "key): `<method>/config.json`.\n"
    )
    with report.open("a") as f:
        f.write(note)
    return note


def _ensure_key(app_dir: Path, run_config: list[str]) -> None:
    """Encrypted methods need the clients' key: create it in the client state folder if there is none."""
    from fedvit.clients.encryption import EncryptionKeyError, ensure_client_key
    from fedvit.core.config import parse_config

    config = parse_config(resolved_run_config(app_dir, run_config))
    if config.encryption.enabled:
        try:
            ensure_client_key(config.model)
        except EncryptionKeyError as err:
            raise SystemExit(f"encryption key: {err}") from None


def method_config(exp: Experiment, app_dir: Path, out: Path, label: str, overrides: list[str]) -> Path:
    """One TOML file with the method's whole override set: presets, then ``overrides`` in order, merged key by key
    (``flwr run -c`` takes one file, unmixed)."""
    values = merge_overrides([str(app_dir / preset) for preset in exp.base] + overrides)
    values |= {"out-dir": str(out), "run-name": label}
    return write_overrides(values, out / ".configs" / f"{label}.toml")


def _accuracy_series(run_dir: Path) -> list[tuple[int, float]]:
    rounds = json.loads((run_dir / "metrics.json").read_text())["rounds"]
    key = "central-accuracy" if any("central-accuracy" in r for r in rounds) else "eval-accuracy"
    return [(r["round"], r[key]) for r in rounds if key in r]


def summarize(out: Path, labels: list[str]) -> str:
    """Markdown table of final and best accuracy per method; also written as summary.md/.json."""
    rows: list[dict[str, Any]] = []
    for label in labels:
        series = _accuracy_series(out / label)
        best_round, best = max(series, key=lambda p: p[1])
        rows.append(
            {"method": label, "final": series[-1][1], "best": best, "best-round": best_round, "rounds": series[-1][0]}
        )
    lines = ["| method | final accuracy | best accuracy (round) | rounds |", "|---|---|---|---|"]
    lines += [
        f"| {r['method']} | {100 * r['final']:.2f}% | {100 * r['best']:.2f}% ({r['best-round']}) | {r['rounds']} |"
        for r in rows
    ]
    table = "\n".join(lines)
    (out / "summary.md").write_text(table + "\n")
    (out / "summary.json").write_text(json.dumps(rows, indent=2))
    return table


def plot_accuracy(out: Path, labels: list[str]) -> Path:
    """All methods' accuracy per round on one figure (Fig. 5 analogue)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label in labels:
        rounds, acc = zip(*_accuracy_series(out / label), strict=True)
        ax.plot(rounds, [100 * a for a in acc], label=label)
    ax.set_xlabel("round")
    ax.set_ylabel("test accuracy (%)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path = out / "accuracy.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
