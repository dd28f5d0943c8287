"""The run config as fedvit resolves it for every command: pyproject defaults, then each ``-c`` in order, merged
key by key on flattened keys, and checked; ``flwr run`` gets the merge as one file.

Flower 1.41's own ``parse_config_args`` loads each ``-c`` string as TOML and merges with a shallow ``dict.update``,
so ``-c "data.name='x'" -c "data.partitioner='iid'"`` silently drops ``data.name``; fedvit never hands Flower more
than one override.
"""

from __future__ import annotations

import re
import sys
import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import tomli_w

from fedvit.core.config import ConfigError, parse_config

# Flower's key=value syntax: values are TOML (strings quoted), pairs separated by whitespace.
PAIR = re.compile(r"(\S+?)=('[^']*'|\"[^\"]*\"|\S+)")


def flatten(table: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"data": {"name": "x"}}`` -> ``{"data.name": "x"}``."""
    flat: dict[str, Any] = {}
    for key, value in table.items():
        name = f"{prefix}{key}"
        flat |= flatten(value, f"{name}.") if isinstance(value, dict) else {name: value}
    return flat


def parse_override(text: str) -> dict[str, Any]:
    """One ``-c`` argument as flat keys: a ``.toml`` file, or ``key=value`` pairs with TOML values."""
    text = text.strip()
    if text.endswith(".toml"):
        with Path(text).expanduser().open("rb") as f:
            return flatten(tomllib.load(f))
    pairs = PAIR.findall(text)
    leftover = PAIR.sub("", text).strip()
    if leftover:
        raise ValueError(f"-c {text!r}: {leftover!r} is not a key=value pair (strings need quotes: key='text')")
    flat: dict[str, Any] = {}
    for key, value in pairs:
        try:
            flat |= flatten(tomllib.loads(f"{key} = {value}"))
        except tomllib.TOMLDecodeError:
            raise ValueError(f"-c {key}={value}: not a TOML value (strings need quotes: {key}='text')") from None
    return flat


def merge_overrides(overrides: Iterable[str]) -> dict[str, Any]:
    """All ``-c`` arguments in order, later keys winning key by key (never table by table)."""
    merged: dict[str, Any] = {}
    for text in overrides:
        if text.strip():
            merged |= parse_override(text)
    return merged


def app_defaults(app_dir: Path) -> dict[str, Any]:
    """``[tool.flwr.app.config]`` of the app's pyproject.toml, flattened."""
    with (app_dir / "pyproject.toml").open("rb") as f:
        return flatten(tomllib.load(f)["tool"]["flwr"]["app"].get("config", {}))


def resolved_run_config(app_dir: Path, overrides: Iterable[str]) -> dict[str, Any]:
    """The run config a run gets: the app's defaults with the merged overrides; unknown keys are errors."""
    defaults = app_defaults(app_dir)
    merged = merge_overrides(overrides)
    unknown = sorted(set(merged) - set(defaults))
    if unknown:
        raise ValueError(f"unknown config key(s) {unknown}; every key must be in [tool.flwr.app.config]")
    return defaults | merged


def write_overrides(values: dict[str, Any], path: Path) -> Path:
    """Flat ``values`` as one TOML file, the single ``-c`` that ``flwr run`` accepts for them."""
    nested: dict[str, Any] = {}
    for key, value in values.items():
        *tables, leaf = key.split(".")
        node = nested
        for table in tables:
            node = node.setdefault(table, {})
        node[leaf] = value
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(tomli_w.dumps(nested))
    return path


def check_config(app_dir: Path, overrides: list[str], local_data: bool = True) -> int:
    """Validate the resolved run config; print one line and return 2 on the first error.

    With ``local_data`` the data must be here too (an ``imagefolder:`` path exists and holds images); runs on a
    remote deployment pass False, since there only the clients' machines hold the data.
    """
    try:
        config = parse_config(resolved_run_config(app_dir, overrides))
        if local_data and config.data.imagefolder_path is not None:
            from fedvit.core.data import check_imagefolder  # torch (seconds): only when there is a folder to check

            check_imagefolder(config.data)
    except ConfigError as err:
        print(err, file=sys.stderr)
        return 2
    except (ValueError, OSError) as err:  # unreadable override file, bad TOML, unknown key
        print(f"config error: {err}", file=sys.stderr)
        return 2
    return 0
