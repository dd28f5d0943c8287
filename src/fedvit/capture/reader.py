"""Captures as the audit reads them (the one layout of :mod:`fedvit.capture.writer`): train exchanges with their ground
truth and round 0's key handshakes, the arrays mapped onto a model, the client's recipe read from the records. The
server's own view (``captures/server``) is read only when pointed at it."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load_file

from fedvit.capture.writer import (
    CAPTURES,
    EXCHANGE_SEP,
    GROUND_TRUTH,
    SECAGG_RECORD,
    exchange_number,
    restore_bytes,
    unflatten,
)

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
    received: dict[str, np.ndarray]  # the model's arrays
    sent: dict[str, np.ndarray]
    received_config: dict[str, Any]
    sent_metrics: dict[str, Any]
    run_config: dict[str, Any]
    received_records: dict[str, dict[str, np.ndarray]] = dataclasses.field(default_factory=dict)  # all of them
    sent_records: dict[str, dict[str, np.ndarray]] = dataclasses.field(default_factory=dict)
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)  # labels a producer added (the benchmark's)
    observer: str | None = None  # who recorded it: "client-mod", "wire-tap", "server", "benchmark"
    app_code: Path | None = None  # the app bundle the tap kept for this run (its code), or the folder a capture named
    received_configs: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)  # by record, bytes kept
    sent_configs: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    number: int = 1  # the exchange's place among its node's exchanges of this round (SecAgg+: its stage)
    members: tuple[Any, ...] = ()  # an aggregate's (SecAgg+): the nodes whose updates it sums

    @property
    def secagg_stage(self) -> str | None:
        """The SecAgg+ stage this exchange is (Flower's ``secaggplus_configs``), else None."""
        stage = self.received_configs.get(SECAGG_RECORD, {}).get("stage")
        return None if stage is None else str(stage)

    @property
    def label(self) -> str:
        return f"run {self.run_id} round {self.round} node {self.node}"

    def ground_truth(self) -> dict[str, np.ndarray] | None:
        """The client's recorded true batch (fedvit's ``capture.ground-truth``), or None. For scoring only. A
        SecAgg+ aggregate's: its members' batches together, where every member recorded one (a fedvit run;
        another app's members' images come from ``--data``)."""
        if not self.members:
            path = ground_truth_file(self.stem)
            return load_file(str(path)) if path.is_file() else None
        paths = [ground_truth_file(self.stem.parent / f"node-{member}") for member in self.members]
        if not all(path.is_file() for path in paths):
            return None
        batches = [load_file(str(path)) for path in paths]
        return {key: np.concatenate([batch[key] for batch in batches]) for key in ("images", "labels")}


def ground_truth_file(stem: Path) -> Path:
    """``run-<id>/ground-truth/round-NNNN/<name>.safetensors`` of a client's or the server's capture."""
    round_dir = stem.parent
    captures = round_dir.parent if round_dir.parent.name == CAPTURES else round_dir.parent.parent
    return captures.parent / GROUND_TRUTH / round_dir.name / f"{stem.name}.safetensors"


def _merged(records: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One dict of several records' values; the first record that names a key wins (a train reply's own
    ``metrics`` before any evaluation record riding along)."""
    out: dict[str, Any] = {}
    for record in records.values():
        for key, value in record.items():
            out.setdefault(key, value)
    return out


def _model_arrays(records: dict[str, dict[str, np.ndarray]], stem: Path, direction: str) -> dict[str, np.ndarray]:
    """The ArrayRecord that holds the model: the only one, else Flower's ``arrays``."""
    if len(records) == 1:
        return next(iter(records.values()))
    if "arrays" in records:
        return records["arrays"]
    raise AuditInputError(f"{stem}: {direction} carries several ArrayRecords {sorted(records)} and none is 'arrays'")


def find_manifests(path: Path) -> list[Path]:
    """Train-exchange manifests (``node-<id>.json``, and ``node-<id>~<k>.json`` for a round's further exchanges)
    under ``path``, the server's view only when asked for."""
    server_view = path.resolve().name == "server"  # pointed at a captures/server folder
    found = [
        p
        for p in sorted(path.rglob("node-*.json"))
        if re.fullmatch(rf"node-\d+({EXCHANGE_SEP}\d+)?", p.stem)
        and (server_view or "server" not in p.relative_to(path).parts)
    ]
    return sorted(found, key=_order)


def _order(path: Path) -> tuple[int, str, int, int]:
    """Captures in run, round, node and exchange order (SCAFFOLD's control variates are summed round by round;
    a protocol's stages follow one another)."""
    run = next((int(m.group(1)) for part in path.parts if (m := re.fullmatch(r"run-(\d+)", part))), 0)
    node = int(path.stem.removeprefix("node-").partition(EXCHANGE_SEP)[0])
    return run, path.parent.name, node, exchange_number(path.with_suffix(""))


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
        received_raw, sent_raw = load_file(str(received_file)), load_file(str(sent_file))
        received, sent = unflatten(received_raw), unflatten(sent_raw)
        received_configs = restore_bytes(manifest.get("received", {}).get("config", {}), received_raw)
        secagg = SECAGG_RECORD in received_configs or SECAGG_RECORD in manifest.get("sent", {}).get("config", {})
        if (not received or not sent) and not secagg:  # SecAgg+'s stages carry their payload in ConfigRecords
            skipped.append(f"{stem}: no arrays in one direction")
            continue
        sent_metrics = _merged(manifest.get("sent", {}).get("metrics", {}))
        partition = manifest.get("partition")
        partition = sent_metrics.get("partition-id") if partition in (None, "") else partition  # the server's view
        num_partitions = (manifest.get("node-config") or {}).get("num-partitions")
        run, run_info = _run_file(stem)
        exchanges.append(
            Exchange(
                stem=stem,
                run_id=manifest.get("run-id"),
                round=int(manifest.get("round", 0)),
                node=manifest.get("node"),
                partition=None if partition in (None, "") else int(partition),
                num_partitions=None if num_partitions in (None, "") else int(num_partitions),
                received=_model_arrays(received, stem, "received") if received else {},
                sent=_model_arrays(sent, stem, "sent") if sent else {},
                received_config=_merged(received_configs),
                sent_metrics=sent_metrics,
                run_config=dict(manifest.get("run_config") or {}) | dict(run_info.get("run_config", {})),
                received_records=received,
                sent_records=sent,
                meta=dict(manifest.get("meta") or {}),
                observer=manifest.get("observer"),
                app_code=_app_code(run, run_info, manifest),
                received_configs=received_configs,
                sent_configs=restore_bytes(manifest.get("sent", {}).get("config", {}), sent_raw),
                number=exchange_number(stem),
            )
        )
    return exchanges, skipped


def load_handshake(path: Path) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]] | None:
    """The first round-0 key handshake under ``path`` (``node-<id>-query``: the public initial layers the node
    received and their encryption it sent back), or None."""
    for manifest in sorted(path.rglob("round-0000/node-*-query.json")):
        stem = manifest.with_suffix("")
        files = [stem.with_name(f"{stem.name}.{d}.safetensors") for d in ("received", "sent")]
        if all(f.is_file() for f in files):
            plain, cipher = (unflatten(load_file(str(f))).get("arrays", {}) for f in files)
            if plain and cipher:
                return plain, cipher
    return None


def _run_file(stem: Path) -> tuple[Path, dict[str, Any]]:
    """The run folder of a capture (``run-<id>``) and what a wire tap completed after the fact in its ``run.json``
    (the fused run config, the FAB it kept), else nothing."""
    run = stem.parent.parent.parent  # run-<id>/captures/round-NNNN/<stem>
    run_file = run / "run.json"
    return run, json.loads(run_file.read_text()) if run_file.is_file() else {}


def _app_code(run: Path, run_info: dict[str, Any], manifest: dict[str, Any]) -> Path | None:
    """Where the captured app's code is: the FAB a wire tap kept (``run.json``'s ``fab-file``, relative to the tap's
    folder), or the folder a ``capture_mod`` or ``CapturingStrategy`` recorded (``app-dir``); None: neither."""
    if fab := run_info.get("fab-file"):
        path = run.parent / fab
        return path if path.is_file() else None
    folder = manifest.get("app-dir")
    return Path(folder) if folder and Path(folder).is_dir() else None


def unreadable_links(path: Path) -> int:
    """Connections a wire tap relayed without reading them (TLS or HTTP/2): as its ``tap.json`` counts them (every
    connection, those still open when it stopped too), else the entries of its ``connections.jsonl`` (written as
    each connection closes)."""
    count = 0
    for log_file in path.rglob("connections.jsonl"):
        summary = log_file.parent / "tap.json"
        if summary.is_file():
            with contextlib.suppress(ValueError, AttributeError, TypeError):
                links = json.loads(summary.read_text()).get("connections", {})
                count += int(links.get("tls", 0)) + int(links.get("http2", 0))
                continue
        for line in log_file.read_text().splitlines():
            if line.strip() and not json.loads(line).get("readable", True):
                count += 1
    return count
