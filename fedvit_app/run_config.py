"""The run config as ``flwr run`` resolves it (pyproject defaults + ``-c`` overrides), and its validation."""

from __future__ import annotations

import sys
from pathlib import Path

from core.config import ConfigError, parse_config


def resolved_run_config(app_dir: Path, overrides: list[str]) -> dict:
    """The run config ``flwr run`` would use: pyproject defaults fused with ``-c`` overrides."""
    from flwr.common.config import flatten_dict, fuse_dicts, get_project_config, parse_config_args

    defaults = get_project_config(app_dir)["tool"]["flwr"]["app"].get("config", {})
    return fuse_dicts(flatten_dict(defaults), parse_config_args(overrides or None))


def check_config(app_dir: Path, overrides: list[str]) -> int:
    """Validate the fused run config; print one line and return 2 on the first error."""
    try:
        parse_config(resolved_run_config(app_dir, overrides))
    except ConfigError as err:
        print(err, file=sys.stderr)
        return 2
    except (ValueError, OSError) as err:  # unreadable override file, bad TOML
        print(f"config error: {err}", file=sys.stderr)
        return 2
    return 0
