"""Captures of any Flower app as the audit reads them: train exchanges and the arrays mapped onto a model.

Reads the layout of :mod:`attacks.capture` (wire tap, ``capture_mod``, ``CapturingStrategy``): per exchange what
the node received (the model's ArrayRecord, ConfigRecords, the run config) and what it sent (arrays, metrics).
The server's own view (``captures/server``) is read only when pointed at it.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load_file
from torch import nn

from attacks.eavesdropper import unflatten

NOTHING_ON_THE_WIRE = "the wire shows nothing; the server still sees every update"


class AuditInputError(ValueError):
    """Captures, model or options the audit cannot work with (the message says what to change)."""


@dataclasses.dataclass
class Exchange:
    """One captured train exchange: what the node received and what it sent back."""

    stem: Path
    run_id: Any
    round: int
    node: Any
    partition: int | None  # where the capture knew it (capture_mod records the node config)
    num_partitions: int | None  # the node config's num-partitions, where recorded
    received: dict[str, np.ndarray]
    sent: dict[str, np.ndarray]
    received_config: dict[str, Any]
    sent_metrics: dict[str, Any]
    run_config: dict[str, Any]

    @property
    def label(self) -> str:
        return f"run {self.run_id} round {self.round} node {self.node}"


def _merged(records: dict[str, dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for record in records.values():
        out.update(record)
    return out


def _model_arrays(records: dict[str, dict[str, np.ndarray]], stem: Path, direction: str) -> dict[str, np.ndarray]:
    """The ArrayRecord that holds the model: the only one, else Flower's ``arrays``."""
    if len(records) == 1:
        return next(iter(records.values()))
    if "arrays" in records:
        return records["arrays"]
    raise AuditInputError(f"{stem}: {direction} carries several ArrayRecords {sorted(records)} and none is 'arrays'")


def find_manifests(path: Path) -> list[Path]:
    """Train-exchange manifests (``node-<id>.json``) under ``path``, the server's view only when asked for."""
    server_view = path.resolve().name == "server"  # pointed at a captures/server folder
    found = [
        p
        for p in sorted(path.rglob("node-*.json"))
        if re.fullmatch(r"node-\d+", p.stem) and (server_view or "server" not in p.relative_to(path).parts)
    ]
    return sorted(found, key=lambda p: (p.parent.name, p.stem))


def load_exchanges(path: Path) -> tuple[list[Exchange], list[str]]:
    """Every complete train exchange under ``path``, and a note per capture that was skipped (and why)."""
    exchanges, skipped = [], []
    for manifest_path in find_manifests(path):
        stem = manifest_path.with_suffix("")
        manifest = json.loads(manifest_path.read_text())
        sent_file = stem.with_name(f"{stem.name}.sent.safetensors")
        received_file = stem.with_name(f"{stem.name}.received.safetensors")
        if "error" in manifest.get("sent", {}):
            skipped.append(f"{stem.name} round {manifest.get('round')}: the reply was an error")
            continue
        if not (sent_file.exists() and received_file.exists()):
            skipped.append(f"{stem}: one direction was not captured")
            continue
        received = unflatten(load_file(str(received_file)))
        sent = unflatten(load_file(str(sent_file)))
        if not received or not sent:
            skipped.append(f"{stem}: no arrays in one direction")
            continue
        partition = manifest.get("partition")
        num_partitions = (manifest.get("node-config") or {}).get("num-partitions")
        exchanges.append(
            Exchange(
                stem=stem,
                run_id=manifest.get("run-id"),
                round=int(manifest.get("round", 0)),
                node=manifest.get("node"),
                partition=None if partition in (None, "") else int(partition),
                num_partitions=None if num_partitions in (None, "") else int(num_partitions),
                received=_model_arrays(received, stem, "received"),
                sent=_model_arrays(sent, stem, "sent"),
                received_config=_merged(manifest.get("received", {}).get("config", {})),
                sent_metrics=_merged(manifest.get("sent", {}).get("metrics", {})),
                run_config=dict(manifest.get("run_config") or {}) | _run_file_config(stem),
            )
        )
    return exchanges, skipped


def _run_file_config(stem: Path) -> dict[str, Any]:
    """The run config a wire tap completed after the fact (``run-<id>/run.json``), else nothing."""
    run_file = stem.parent.parent.parent / "run.json"  # run-<id>/captures/round-NNNN/<stem>
    return dict(json.loads(run_file.read_text()).get("run_config", {})) if run_file.is_file() else {}


def unreadable_links(path: Path) -> int:
    """Connections a wire tap relayed without reading them (TLS or HTTP/2), from its ``connections.jsonl``."""
    count = 0
    for log_file in path.rglob("connections.jsonl"):
        for line in log_file.read_text().splitlines():
            if line.strip() and not json.loads(line).get("readable", True):
                count += 1
    return count


def map_state(arrays: dict[str, np.ndarray], model: nn.Module, what: str) -> dict[str, np.ndarray]:
    """``arrays`` keyed by the model's ``state_dict`` names: by name when the keys are the state_dict's; by order
    (all of the state_dict, or its parameters only) when no key is a state_dict name (e.g. "0", "1", ... from a
    list of arrays) and every shape agrees; else one error that lists the keys and shapes that do not match."""
    state = {n: tuple(t.shape) for n, t in model.state_dict().items()}
    params = {n: tuple(p.shape) for n, p in model.named_parameters()}
    got = {n: tuple(a.shape) for n, a in arrays.items()}
    if set(got) <= set(state) and set(params) <= set(got):
        wrong = [f"{n}: captured {got[n]}, model {state[n]}" for n in got if got[n] != state[n]]
        if not wrong:
            return dict(arrays)
        raise AuditInputError(f"{what}: shapes differ from the model's state_dict: {'; '.join(wrong[:8])}")
    values = list(arrays.values())
    for names in (list(state), list(params)) if not set(got) & set(state) else ():  # keys that are not names
        if len(values) == len(names) and all(tuple(v.shape) == state[n] for v, n in zip(values, names, strict=True)):
            return dict(zip(names, values, strict=True))
    missing = [n for n in state if n not in got][:8]
    unexpected = [n for n in got if n not in state][:8]
    raise AuditInputError(
        f"{what}: the captured arrays match the model neither by name nor by order ({len(got)} captured, "
        f"{len(state)} in the state_dict, {len(params)} parameters); missing {missing}, unexpected {unexpected} "
        "— is --model the app's model?"
    )
