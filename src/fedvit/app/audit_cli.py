"""``fedvit audit``: the one audit command, for captures of any Flower app (fedvit's own included) and for the
no-run benchmark; :data:`DESCRIPTION` says how its options are grouped and what ``fedvit-audit.toml`` holds."""

from __future__ import annotations

import argparse
import sys
import tomllib
from pathlib import Path
from typing import Any

from fedvit.app.run_config import check_config, merge_overrides, resolved_run_config
from fedvit.attacks.model_spec import ModelSpec, SpecError
from fedvit.core.config import AuditConfig, ConfigError, is_dataset_name, parse_config, parse_selection

SPEC_FILE = "fedvit-audit.toml"
DESCRIPTION = f"""Attack captured updates of any Flower app (fedvit's own included) or, with --benchmark, updates that
fedvit's client code makes, and score what comes back.

The options are grouped by what they act on: the captures, the attacked model (another app's only: fedvit's
captures name their own), the clients' data for scoring, the attack budget, the benchmark. An option given where
it cannot apply is an error that says why. For captures of another app the flags win over a {SPEC_FILE} in the
captures folder or one of its two parents:

    [model]
    factory = "cnnapp.task:Net"      # or a timm name, e.g. "resnet18"
    input = [3, 32, 32]              # C, H, W of the images the client feeds (pixels in [0, 1] before mean/std)
    mean = [0.5, 0.5, 0.5]
    std = [0.5, 0.5, 0.5]
    loss = "cross-entropy"           # or "nll" (the model ends in log_softmax)
    app-dir = "path/to/app"          # put on sys.path so the factory imports (relative to the TOML)
    num-classes = 10                 # timm names only (default: the captured head's size)
    [model.args]                     # keyword arguments of the factory, as --model-arg (e.g. num_classes = 10)
    [recipe]                         # recipe values, as --recipe
    [data]                           # loader or name, partitions = {{"<node id>" = <partition>}},
                                     # decoy-partitions; for a dataset name num-partitions and settings
"""
MODEL_FLAGS = ("model", "model_arg", "app_dir", "input", "mean", "std", "loss")
DATA_FLAGS = ("data", "num_partitions", "data_option", "partition", "decoy_partitions")
RECIPE_FLAGS = ("sent", "recipe")
BENCHMARK_FLAGS = ("images", "defences", "batch_sizes", "local_steps", "accuracy_from", "model_from", "keep")
# = fedvit.attacks.membership.REFERENCES, not imported here (torch); tests/test_public_api.py keeps them equal
MEMBERSHIP_REFERENCES = 8
BUDGET_FLAGS = {"iterations": "iterations", "restarts": "restarts", "max_seconds": "max-seconds", "tv": "tv"}


def add_parser(sub: argparse._SubParsersAction) -> None:
    """``fedvit audit`` and its option groups."""
    p = sub.add_parser(
        "audit",
        help="attack captured updates of any Flower app (or --benchmark) and score the reconstructions",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    g = p.add_argument_group("captures")
    g.add_argument("captures", nargs="?", type=Path, help="a capture folder (a run folder, its captures/ folder or a "
                   "`fedvit tap` output); not with --benchmark")  # fmt: skip
    g.add_argument("--out", type=Path, required=True, help="where audit.md, audit.json, grid.png and the frontier go")
    g.add_argument("--sent", choices=("auto", "gradient", "weights"), help="what another app's replies carry "
                   "(default auto: read from their per-layer norm against the received weights)")  # fmt: skip
    g.add_argument("--recipe", action="append", default=[], help="KEY=VALUE of another app's client recipe: lr, "
                   "local-epochs, local-steps, batch-size, momentum, num-examples, optimizer, augment, a DP claim "
                   "(epsilon, delta, noise-multiplier, clipping-norm) or LocalDpMod's settings (local-dp-epsilon, "
                   "local-dp-delta, local-dp-clipping-norm, local-dp-sensitivity) (repeatable)")  # fmt: skip
    g.add_argument("--no-fit-check", action="store_true", help="report the figures that simulate the client's recipe "
                   "even where that recipe does not reproduce the update (to see what the check withholds; the "
                   "fit is still reported)")  # fmt: skip
    g.add_argument("--app", type=Path, help="the app's code, a folder or a FAB, to read the client's recipe from "
                   "(optimiser, lr, momentum, transforms, epochs, batch size); default: the FAB `fedvit tap` kept, or "
                   "the app folder capture_mod/CapturingStrategy recorded. Parsed, never executed")  # fmt: skip

    g = p.add_argument_group("model (captures of another app; fedvit's captures name their own)")
    g.add_argument("--model", help="package.module:factory returning the app's nn.Module, or a timm model name")
    g.add_argument("--model-arg", action="append", default=[], help="KEY=VALUE: a keyword argument of the factory "
                   "(get_model(num_classes=10): --model-arg num_classes=10; values read as TOML: 10, 0.5, true, "
                   "else text; repeatable)")  # fmt: skip
    g.add_argument("--app-dir", help="folder to import the factory (and --data) from, e.g. the app's root")
    g.add_argument("--input", help="C,H,W of the client's images (default 3,32,32)")
    g.add_argument("--mean", help="per-channel mean the app normalises with (default 0.5 each)")
    g.add_argument("--std", help="per-channel std the app normalises with (default 0.5 each)")
    g.add_argument("--loss", help="cross-entropy (default) or nll (a model that ends in log_softmax)")

    g = p.add_argument_group("data (scoring; default: the ground truth fedvit's clients recorded)")
    g.add_argument("--data", help="the clients' data: package.module:loader, loader(partition_id) -> (images "
                   "[N,C,H,W] in [0,1], labels); or a dataset as data.name takes it (cifar10, imagefolder:PATH, "
                   "synthetic), partitioned as fedvit partitions it")  # fmt: skip
    g.add_argument("--partition", action="append", default=[], help="NODE=PARTITION: which partition a node holds")
    g.add_argument("--num-partitions", type=int, help="with a dataset name: how many partitions it was split into "
                   "(default: the num-partitions the captured node config recorded)")  # fmt: skip
    g.add_argument("--data-option", action="append", default=[], help="with a dataset name: KEY=VALUE of fedvit's "
                   "data.* settings or seed, e.g. partitioner=dirichlet (repeatable)")  # fmt: skip
    g.add_argument("--decoy-partitions", help="with a loader: partitions whose images are decoys, e.g. 4-40")
    g.add_argument("--canaries", help="package.module:loader, loader(partition_id) -> (images, labels, included): "
                   "canaries planted in that partition's training, each included with probability 1/2; membership "
                   "then scores them (included against left out) and tests the update's DP claim")  # fmt: skip
    g.add_argument("--decoys", type=int, default=99, help="test-split images beside the true one in the "
                   "re-identification gallery of recorded ground truth (default 99: chance 1%%; 0: off)")  # fmt: skip
    g.add_argument("--membership-references", type=int, default=MEMBERSHIP_REFERENCES, metavar="K",
                   help="shadow updates behind the shadow-alignment membership score (the client's local "
                   "training simulated on half the non-member images at the estimated class counts; at most "
                   "60 s): each image's gradient against what the update holds beyond them (default "
                   "%(default)s; 0: that score off, the loss scores only)")  # fmt: skip

    g = p.add_argument_group("budget (the optimisation attacks)")
    g.add_argument("-c", "--run-config", action="append", default=[], help="key=value or a TOML file: audit.* keys "
                   "for captures (default: a fedvit run's own); any key of the benchmark's run config")  # fmt: skip
    g.add_argument("--iterations", type=int, help="Adam steps per restart (default 1500)")
    g.add_argument("--restarts", type=int, help="random starts (default 2)")
    g.add_argument("--max-seconds", type=float, help="wall-clock cap per update (default 90)")
    g.add_argument("--tv", type=float, help="total-variation prior weight (default by model: 0.05 for a ViT, 0.4 "
                   "otherwise; docs/results/benchmarks.md)")  # fmt: skip
    g.add_argument("--budgets", help="comma-separated Adam steps per restart, e.g. 600,2400,9600: one row per budget "
                   "and a leakage-vs-budget panel (--max-seconds still caps each run)")  # fmt: skip
    g.add_argument("--device", help="auto (CUDA where there is one), cpu or cuda (default: a fedvit run's own "
                   "device, else auto)")  # fmt: skip
    g.add_argument("--config-app", default=".", help="the fedvit app folder whose config -c amends (default: .)")

    g = p.add_argument_group("benchmark (no capture needed: client updates made by fedvit's own client code)")
    g.add_argument("--benchmark", action="store_true", help="make client updates per defence and setting, as "
                   "captures, and audit them")  # fmt: skip
    g.add_argument("--images", type=int, help="updates per defence and setting (default 16)")
    g.add_argument("--defences", help="comma-separated subset of the defences (default: all)")
    g.add_argument("--batch-sizes", help="comma-separated client batch sizes (default 1)")
    g.add_argument("--local-steps", help="comma-separated local steps; 1 = FedSGD, E > 1 = FedAvg with E steps "
                   "(default 1)")  # fmt: skip
    g.add_argument("--accuracy-from", type=Path, help="a finished `fedvit experiment` folder (e.g. of "
                   "conf/experiments/frontier-cpu.toml): its final accuracies give the accuracy cost")  # fmt: skip
    g.add_argument("--model-from", type=Path, help="attack the final model of a finished run (its model.* settings "
                   "and model.safetensors) instead of a randomly initialised one")  # fmt: skip
    g.add_argument("--keep", type=Path, help="keep the benchmark's captures in this folder (default: a temporary "
                   "folder, deleted after the audit)")  # fmt: skip


def given(args: argparse.Namespace, names: tuple[str, ...]) -> list[str]:
    """The flags among ``names`` the user gave (as they are spelt on the command line)."""
    return ["--" + n.replace("_", "-") for n in names if getattr(args, n) not in (None, [], False)]


def positive_list(text: str, flag: str) -> list[int]:
    """ "1,4,16" -> [1, 4, 16]; anything else is a ValueError naming the flag."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"{flag} takes comma-separated integers >= 1, got {text!r}") from None
    if not values or min(values) < 1:
        raise ValueError(f"{flag} takes comma-separated integers >= 1, got {text!r}")
    return values


def misplaced(args: argparse.Namespace) -> str | None:
    """Why an option cannot apply in the mode the command runs in (None when every option can)."""
    if args.benchmark == (args.captures is not None):
        return "give a capture folder or --benchmark (not both)"
    if args.benchmark:
        for flags, why in (
            (given(args, MODEL_FLAGS), "the benchmark attacks fedvit's own model (set it with -c model.*)"),
            (given(args, DATA_FLAGS), "the benchmark scores against the images its own clients trained on"),
            (given(args, RECIPE_FLAGS), "the benchmark's clients follow its run config (set it with -c)"),
        ):
            if flags:
                return f"{', '.join(flags)}: {why}"
        return None
    flags = given(args, BENCHMARK_FLAGS)
    return f"{', '.join(flags)}: for --benchmark only (a capture folder holds its own updates)" if flags else None


def audit_budget(args: argparse.Namespace) -> AuditConfig | None:
    """The attack budget from ``-c audit.*`` and the budget flags (None: a fedvit run's own ``audit.*``)."""
    flags = {key: getattr(args, name) for name, key in BUDGET_FLAGS.items() if getattr(args, name) is not None}
    if not args.run_config and not flags:
        return None
    values = merge_overrides(args.run_config)
    foreign = sorted(k for k in values if not k.startswith("audit."))
    if foreign:
        raise ValueError(f"auditing captures takes only audit.* settings in -c (the run's config is fixed): {foreign}")
    overrides = list(args.run_config) + [f"audit.{key}={value}" for key, value in flags.items()]
    try:
        return parse_config(resolved_run_config(Path(args.config_app), overrides)).audit
    except ConfigError as err:
        raise ValueError(str(err)) from None


def main(args: argparse.Namespace) -> int:
    """Exit 0 with the report written, 2 on input the audit cannot use (the message says what to change)."""
    from fedvit.capture.reader import AuditInputError

    problem = misplaced(args)
    if problem is not None:
        print(f"fedvit audit: {problem}", file=sys.stderr)
        return 2
    try:
        if args.decoys < 0 or args.membership_references < 0:
            raise ValueError("--decoys and --membership-references must be >= 0")
        budgets = sorted(set(positive_list(args.budgets, "--budgets"))) if args.budgets else None
        for flag, value in (("--iterations", args.iterations), ("--restarts", args.restarts)):
            if value is not None and value < 1:
                raise ValueError(f"{flag} must be at least 1, got {value}")
        if args.max_seconds is not None and args.max_seconds <= 0 or args.tv is not None and args.tv < 0:
            raise ValueError("--max-seconds must be positive and --tv not negative")
        if args.benchmark:
            return benchmark(args, budgets)
        audit_captures(args, budgets)
    except (AuditInputError, SpecError, ValueError, FileNotFoundError) as err:
        print(f"fedvit audit: {err}", file=sys.stderr)
        return 2
    print(f"audit written to {Path(args.out) / 'audit.md'}")
    return 0


def audit_captures(args: argparse.Namespace, budgets: list[int] | None) -> None:
    """The audit of a capture folder; another app's captures take the model, recipe and data options."""
    from fedvit.audit.pipeline import AuditOptions
    from fedvit.audit.pipeline import audit_captures as run_audit

    options = AuditOptions(
        budget=audit_budget(args),
        tv_by_model=args.tv is None and "audit.tv" not in merge_overrides(args.run_config),
        sent_as=args.sent or "auto",
        decoys=args.decoys,
        references=args.membership_references,
        budgets=budgets,
        device=args.device,
        fit_check=not args.no_fit_check,
    )
    options = other_app_options(args, options)
    run_audit(args.captures, args.out, options)


def other_app_options(args: argparse.Namespace, options: Any) -> Any:
    """``options`` with another app's model spec, recipe overrides and scoring data from the flags and any
    ``fedvit-audit.toml`` (flags win); unchanged when neither names a model."""
    import dataclasses

    found = find_spec_file(args.captures)
    values = read_spec_file(found) if found else {}
    if found:
        print(f"audit: settings from {found}", flush=True)
    model = dict(values.get("model", {}))
    model |= {k: v for k, v in {"factory": args.model, "app-dir": args.app_dir, "loss": args.loss}.items() if v}
    if args.input:
        model["input"] = [int(v) for v in args.input.split(",")]
    for key in ("mean", "std"):
        if getattr(args, key):
            model[key] = [float(v) for v in getattr(args, key).split(",") if v.strip()]
    model["args"] = dict(model.get("args", {})) | {
        k: _toml_value(v) for k, v in _pairs(args.model_arg, "--model-arg").items()
    }
    spec = spec_from(model) if model.get("factory") else None
    if spec is None and given(args, MODEL_FLAGS):
        raise ValueError(f"{', '.join(given(args, MODEL_FLAGS))} describe the model: give --model as well")
    overrides = {str(k): str(v) for k, v in values.get("recipe", {}).items()} | _pairs(args.recipe, "--recipe")
    from fedvit.attacks.recipe import (  # torch: not at --help
        AUGMENT_KEYS,
        LOCAL_DP_KEYS,
        OPTIMISER_KEYS,
        PRIVACY_KEYS,
        RECIPE_KEYS,
    )

    known = {name for key, aliases in RECIPE_KEYS.items() for name in (key, *aliases)} | {
        *OPTIMISER_KEYS, *AUGMENT_KEYS} | {name for keys in (PRIVACY_KEYS, LOCAL_DP_KEYS) for names in keys.values()
                                           for name in names}  # fmt: skip
    if unknown := sorted(set(overrides) - known):
        raise ValueError(f"--recipe {', '.join(unknown)}: not a recipe key (one of {', '.join(sorted(known))})")
    app = args.app
    if app is not None and not app.exists():
        raise ValueError(f"--app {app}: no such folder or FAB")
    return dataclasses.replace(options, spec=spec, overrides=overrides, data=user_data(args, values, spec), app=app)


def user_data(args: argparse.Namespace, values: dict[str, Any], spec: Any) -> Any:
    """The scoring data from ``--data`` (a loader or a dataset name) and the TOML's ``[data]``; None without."""
    from fedvit.audit.user_data import UserData

    data_values = dict(values.get("data", {}))
    source = args.data or data_values.get("loader") or data_values.get("name")
    if not source:
        extra = given(args, ("partition", "num_partitions", "data_option", "decoy_partitions", "canaries"))
        if extra:
            raise ValueError(f"{', '.join(extra)}: these describe the clients' data: give --data as well")
        return None
    source = str(source)
    settings = {str(k): v for k, v in data_values.get("settings", {}).items()}
    settings |= {k: _toml_value(v) for k, v in _pairs(args.data_option, "--data-option").items()}
    count = args.num_partitions or data_values.get("num-partitions")
    if not is_dataset_name(source) and (settings or count):
        raise ValueError(f"--num-partitions and --data-option apply to a dataset name, not the loader {source}")
    if is_dataset_name(source) and (args.decoy_partitions or data_values.get("decoy-partitions")):
        raise ValueError("--decoy-partitions applies to a loader; a dataset name's decoys are its test split")
    if count is not None and int(count) < 1:
        raise ValueError(f"--num-partitions must be at least 1, got {count}")
    shape = spec.input_shape if spec is not None else None
    if is_dataset_name(source) and shape is not None and shape[1] != shape[2]:
        raise ValueError(f"--data {source} serves square images; the model's input is {shape}")
    partitions = {str(k): int(v) for k, v in data_values.get("partitions", {}).items()}
    partitions |= {k: int(v) for k, v in _pairs(args.partition, "--partition").items()}
    decoys = parse_selection(args.decoy_partitions or str(data_values.get("decoy-partitions", ""))) or ()
    data = UserData(
        source, partitions, tuple(sorted(decoys)), spec.app_dir if spec else args.app_dir, settings,
        None if count is None else int(count), shape[1] if shape else 32, args.canaries or data_values.get("canaries"),
    )  # fmt: skip
    if data.named:
        data.config()  # a wrong data.* setting fails here, before any attack runs
    return data


def benchmark(args: argparse.Namespace, budgets: list[int] | None) -> int:
    """``fedvit audit --benchmark``: client updates per defence and setting, as captures, through the audit."""
    from fedvit.audit.benchmark import Setting, run_benchmark
    from fedvit.audit.frontier import final_accuracies
    from fedvit.core.results import trained_model

    images = 16 if args.images is None else args.images
    if images < 1:
        raise ValueError("--images must be >= 1")
    overrides = list(args.run_config)
    overrides += [f"audit.{key}={getattr(args, name)}" for name, key in BUDGET_FLAGS.items()
                  if getattr(args, name) is not None]  # fmt: skip
    if args.device:
        overrides.append(f"device='{args.device}'")
    if check_config(Path(args.config_app), overrides):
        return 2
    config = parse_config(resolved_run_config(Path(args.config_app), overrides))
    defences = [d.strip() for d in (args.defences or "").split(",") if d.strip()] or None
    settings = [
        Setting(batch, steps)
        for steps in positive_list(args.local_steps or "1", "--local-steps")
        for batch in positive_list(args.batch_sizes or "1", "--batch-sizes")
    ]
    accuracy = final_accuracies(args.accuracy_from) if args.accuracy_from else None
    if args.model_from is not None:
        config = trained_model(config, args.model_from)
        print(f"audit benchmark: attacking the final model of {args.model_from} ({config.model.name})")
    run_benchmark(config, images, args.out.resolve(), defences, settings, accuracy, args.decoys, budgets, args.keep)
    print(f"audit written to {args.out / 'audit.md'}")
    return 0


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


def read_spec_file(path: Path) -> dict[str, Any]:
    """The ``[model]`` table of a ``fedvit-audit.toml`` (keys as in the module docstring), ``app-dir`` made
    relative to the file; other tables are returned under their names for the audit (``recipe``, ``data``)."""
    try:
        values = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as err:
        raise SpecError(f"{path}: not valid TOML ({err})") from err
    model = dict(values.get("model", {}))
    unknown = sorted(set(model) - {"factory", "input", "mean", "std", "loss", "app-dir", "num-classes", "args"})
    if unknown:
        raise SpecError(f"{path}: unknown [model] key(s) {unknown}")
    if not isinstance(model.get("args", {}), dict):
        raise SpecError(f"{path}: [model] args must be a table of keyword arguments (a [model.args] section)")
    if "app-dir" in model:
        model["app-dir"] = str((path.parent / str(model["app-dir"])).resolve())
    return {**values, "model": model}


def find_spec_file(captures: Path) -> Path | None:
    """``fedvit-audit.toml`` in the captures folder or one of its two parents (run folder, capture root)."""
    for folder in [captures, *list(captures.resolve().parents)[:2]]:
        if (folder / SPEC_FILE).is_file():
            return folder / SPEC_FILE
    return None


def spec_from(values: dict[str, Any]) -> ModelSpec:
    """A spec from ``[model]``-style keys (TOML names; flags are merged in by the caller)."""
    if not values.get("factory"):
        raise SpecError(f"no model given: pass --model package.module:factory (or a timm name) or write {SPEC_FILE}")
    kwargs: dict[str, Any] = {"factory": str(values["factory"])}
    if "input" in values:
        kwargs["input_shape"] = tuple(int(v) for v in values["input"])
    channels = kwargs.get("input_shape", (3,))[0]
    for key in ("mean", "std"):
        if key in values:
            v = values[key]
            kwargs[key] = tuple(float(x) for x in (v if isinstance(v, list | tuple) else [v] * channels))
    for key in ("mean", "std"):  # the default 0.5 per channel, for any channel count
        kwargs.setdefault(key, (0.5,) * channels)
    if "loss" in values:
        kwargs["loss"] = str(values["loss"])
    if values.get("app-dir"):
        kwargs["app_dir"] = str(values["app-dir"])
    if values.get("num-classes"):
        kwargs["num_classes"] = int(values["num-classes"])
    if values.get("args"):
        kwargs["args"] = tuple(  # hashable: a spec is a cache key
            sorted((str(k), tuple(v) if isinstance(v, list) else v) for k, v in values["args"].items())
        )
    return ModelSpec(**kwargs)
