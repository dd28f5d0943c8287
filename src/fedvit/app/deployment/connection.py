"""The ``flwr`` CLI's side of a deployment: a named connection in ``$FLWR_HOME/config.toml``."""

from __future__ import annotations

import tomllib
from pathlib import Path

# What flwr writes into a fresh config.toml; kept so that `flwr run .` still means the local simulation.
DEFAULT_CONFIG = '[superlink]\ndefault = "local"\n\n[superlink.local]\naddress = ":local:"\n'


def add_connection(flwr_home: Path, name: str, address: str, root_certificates: Path | None) -> Path:
    """Add ``[superlink.<name>]`` (TLS with ``root_certificates``, else insecure); refuse to change an existing one."""
    config = flwr_home / "config.toml"
    text = config.read_text() if config.exists() else DEFAULT_CONFIG
    existing = tomllib.loads(text).get("superlink", {}).get(name)
    wanted = {"address": address}
    wanted |= {"root-certificates": str(root_certificates.resolve())} if root_certificates else {"insecure": True}
    if existing is not None:
        if existing != wanted:
            raise ValueError(f"{config} already defines [superlink.{name}] differently: {existing}")
        return config
    lines = [f"\n[superlink.{name}]", f'address = "{address}"']
    lines += [f'root-certificates = "{wanted["root-certificates"]}"'] if root_certificates else ["insecure = true"]
    flwr_home.mkdir(parents=True, exist_ok=True)
    config.write_text(text.rstrip("\n") + "\n" + "\n".join(lines) + "\n")
    return config
