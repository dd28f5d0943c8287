"""``fedvit audit <captures> --model package.module:factory``: the audit of any Flower app's captures.

Flags win over ``fedvit-audit.toml`` (found in the captures folder or its two parents; see
:mod:`attacks.model_spec`), whose ``[recipe]`` table holds recipe overrides and ``[data]`` the scoring data
(``loader`` or a dataset ``name``, ``partitions = {"<node id>" = <partition>}``, ``decoy-partitions = "4-40"``;
for a dataset name ``num-partitions`` and ``settings = {partitioner = "dirichlet"}``).
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from pathlib import Path
from typing import Any

from core.config import AuditConfig, is_dataset_name, parse_selection


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags for auditing a third-party app (on ``fedvit audit``)."""
    g = p.add_argument_group("any Flower app (with --model)")
    g.add_argument("--model", help="package.module:factory returning the app's nn.Module, or a timm model name")
    g.add_argument("--app-dir", help="folder to import the factory (and --data) from, e.g. the app's root")
    g.add_argument("--input", help="C,H,W of the client's images (default 3,32,32)")
    g.add_argument("--mean", help="per-channel mean the app normalises with (default 0.5 each)")
    g.add_argument("--std", help="per-channel std the app normalises with (default 0.5 each)")
    g.add_argument("--loss", help="cross-entropy (default) or nll (a model that ends in log_softmax)")
    g.add_argument("--recipe", action="append", default=[], help="KEY=VALUE override: lr, local-epochs, "
                   "local-steps, batch-size, momentum, num-examples (repeatable)")  # fmt: skip
    g.add_argument("--sent", choices=("auto", "gradient", "weights"), default="auto", help="what replies carry")
    g.add_argument("--data", help="the clients' data for scoring: package.module:loader, loader(partition_id) -> "
                   "(images [N,C,H,W] in [0,1], labels); or a dataset as data.name takes it (cifar10, "
                   "imagefolder:PATH, synthetic), partitioned as fedvit partitions it")  # fmt: skip
    g.add_argument("--num-partitions", type=int, help="with a dataset name: how many partitions it was split into "
                   "(default: the num-partitions the captured node config recorded)")  # fmt: skip
    g.add_argument("--data-option", action="append", default=[], help="with a dataset name: KEY=VALUE of fedvit's "
                   "data.* settings or seed, e.g. partitioner=dirichlet (repeatable)")  # fmt: skip
    g.add_argument("--partition", action="append", default=[], help="NODE=PARTITION: which partition a node holds")
    g.add_argument("--decoy-partitions", help="partitions whose images are decoys, e.g. 4-40 (default: none extra)")
    g.add_argument("--iterations", type=int, help="Adam steps per restart (default 1500)")
    g.add_argument("--restarts", type=int, help="random starts (default 2)")
    g.add_argument("--max-seconds", type=float, help="wall-clock cap per update (default 90)")
    g.add_argument("--tv", type=float, help="total-variation prior weight (default by model: 0.05 for a ViT, "
                   "0.4 otherwise; docs/results/benchmarks.md)")  # fmt: skip
    g.add_argument("--device", default="auto", help="auto (CUDA where there is one), cpu or cuda")


def _pairs(items: list[str], flag: str) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise ValueError(f"{flag} takes KEY=VALUE, got {item!r}")
        out[key.strip()] = value.strip()
    return out


def _toml_value(text: str) -> Any:
    """A flag's value as TOML reads it (40 → int, 0.5 → float, true → bool), else the plain string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def _floats(text: str) -> list[float]:
    return [float(v) for v in text.split(",") if v.strip()]


def options(args: argparse.Namespace) -> dict[str, Any]:
    """Flags merged over ``fedvit-audit.toml``: the spec, budget, recipe overrides and scoring data."""
    from attacks.model_spec import find_spec_file, read_spec_file, spec_from

    found = find_spec_file(args.captures)
    values = read_spec_file(found) if found else {}
    if found:
        print(f"audit: settings from {found}", flush=True)
    model = dict(values.get("model", {}))
    flags = {"factory": args.model, "app-dir": args.app_dir, "loss": args.loss}
    model |= {k: v for k, v in flags.items() if v}
    if args.input:
        model["input"] = [int(v) for v in args.input.split(",")]
    for key in ("mean", "std"):
        if getattr(args, key):
            model[key] = _floats(getattr(args, key))
    spec = spec_from(model)
    overrides = {str(k): str(v) for k, v in values.get("recipe", {}).items()} | _pairs(args.recipe, "--recipe")
    budget = AuditConfig(
        **{
            k: v
            for k, v in (
                ("iterations", args.iterations),
                ("restarts", args.restarts),
                ("max_seconds", args.max_seconds),
                ("tv", args.tv),
            )
            if v is not None
        }
    )
    if budget.iterations < 1 or budget.restarts < 1 or budget.max_seconds <= 0 or budget.tv < 0:
        raise ValueError("--iterations, --restarts and --max-seconds must be positive, --tv not negative")
    return {"spec": spec, "budget": budget, "overrides": overrides, "data": user_data(args, values, spec)}


def user_data(args: argparse.Namespace, values: dict[str, Any], spec: Any) -> Any:
    """The scoring data from ``--data`` (a loader or a dataset name) and the TOML's ``[data]``; None without."""
    from attacks.app_audit import UserData

    data_values = dict(values.get("data", {}))
    source = args.data or data_values.get("loader") or data_values.get("name")
    if not source:
        if args.partition or args.num_partitions or args.data_option:
            raise ValueError("--partition, --num-partitions and --data-option need --data (the clients' data)")
        return None
    source = str(source)
    settings = {str(k): v for k, v in data_values.get("settings", {}).items()}
    settings |= {k: _toml_value(v) for k, v in _pairs(args.data_option, "--data-option").items()}
    count = args.num_partitions or data_values.get("num-partitions")
    if not is_dataset_name(source) and (settings or count):
        raise ValueError(f"--num-partitions and --data-option apply to a dataset name, not the loader {source}")
    if count is not None and int(count) < 1:
        raise ValueError(f"--num-partitions must be at least 1, got {count}")
    if is_dataset_name(source) and spec.input_shape[1] != spec.input_shape[2]:
        raise ValueError(f"--data {source} serves square images; the model's input is {spec.input_shape}")
    partitions = {str(k): int(v) for k, v in data_values.get("partitions", {}).items()}
    partitions |= {k: int(v) for k, v in _pairs(args.partition, "--partition").items()}
    decoys = parse_selection(args.decoy_partitions or str(data_values.get("decoy-partitions", ""))) or ()
    data = UserData(
        source, partitions, tuple(sorted(decoys)), spec.app_dir, settings,
        None if count is None else int(count), spec.input_shape[1],
    )  # fmt: skip
    if data.named:
        data.config()  # a wrong data.* setting fails here, before any attack runs
    return data


def audit_app(args: argparse.Namespace) -> int:
    """Exit 0 with the report written, 2 on input the audit cannot use (the message says what to change)."""
    from attacks.app_audit import audit_app_captures
    from attacks.app_captures import AuditInputError
    from attacks.model_spec import SpecError

    try:
        chosen = options(args)
        audit_app_captures(
            args.captures, args.out, chosen["spec"], chosen["budget"], chosen["overrides"], args.sent,
            chosen["data"], args.device, tv_by_model=args.tv is None,
        )  # fmt: skip
    except (AuditInputError, SpecError, ValueError, FileNotFoundError) as err:
        print(f"fedvit audit: {err}", file=sys.stderr)
        return 2
    print(f"audit written to {Path(args.out) / 'audit.md'}")
    return 0
