"""``fedvit audit``: the one audit command, for captures of any Flower app (fedvit's own included) and for the
no-run benchmark; :data:`DESCRIPTION` says how its options are grouped and what ``fedvit-audit.toml`` holds."""

from __future__ import annotations

import argparse
import sys
import tomllib
from pathlib import Path
from typing import Any

from fedvit.app.run_config import check_config, merge_overrides, resolved_run_config
from fedvit.audit.api import SPEC_FILE
from fedvit.core.budget import DEFAULT_DECOYS, MEMBERSHIP_REFERENCES
from fedvit.core.config import parse_config

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
    g.add_argument("--out", type=Path, required=True, help="where audit.md, audit.html, audit.json, the pictures and "
                   "the frontier go")  # fmt: skip
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
                   "(default: the num-partitions the captured node config recorded); with a loader: the partitions "
                   "a node the capture does not map is matched to (default: the capture's node count)")  # fmt: skip
    g.add_argument("--data-option", action="append", default=[], help="with a dataset name: KEY=VALUE of fedvit's "
                   "data.* settings or seed, e.g. partitioner=dirichlet (repeatable)")  # fmt: skip
    g.add_argument("--decoy-partitions", help="with a loader: partitions whose images are decoys, e.g. 4-40")
    g.add_argument("--canaries", help="package.module:loader, loader(partition_id) -> (images, labels, included): "
                   "canaries planted in that partition's training, each included with probability 1/2; membership "
                   "then scores them (included against left out) and tests the update's DP claim")  # fmt: skip
    g.add_argument("--decoys", type=int, default=DEFAULT_DECOYS, help="test-split images beside the true one in the "
                   "re-identification gallery of recorded ground truth (default 99: chance 1%%; 0: off)")  # fmt: skip
    g.add_argument("--membership-references", type=int, default=MEMBERSHIP_REFERENCES, metavar="K",
                   help="shadow updates behind the shadow-alignment membership score (the client's local "
                   "training simulated on half the non-member images at the estimated class counts; at most "
                   "60 s): each image's gradient against what the update holds beyond them (default "
                   "%(default)s; 0: that score off, the loss scores only)")  # fmt: skip
    g.add_argument("--leakage", help="comma-separated leakage types to measure, of labels, membership and images "
                   "(default: all), e.g. membership to test a DP claim against --canaries alone; the others are "
                   "reported as not asked for. The label estimate still runs where a membership figure rests on "
                   "its simulation (the shadow updates and the power twin, neither of which runs where canaries "
                   "are scored)")  # fmt: skip

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
            (given(args, ("leakage",)), "the benchmark measures every leakage type"),
        ):
            if flags:
                return f"{', '.join(flags)}: {why}"
        return None
    flags = given(args, BENCHMARK_FLAGS)
    return f"{', '.join(flags)}: for --benchmark only (a capture folder holds its own updates)" if flags else None


def budget_keywords(args: argparse.Namespace) -> dict[str, Any]:
    """The attack budget as :func:`fedvit.audit.api.audit_captures` takes it: ``-c audit.*`` and the budget flags."""
    values = merge_overrides(args.run_config)
    foreign = sorted(k for k in values if not k.startswith("audit."))
    if foreign:
        raise ValueError(f"auditing captures takes only audit.* settings in -c (the run's config is fixed): {foreign}")
    budget = {k.removeprefix("audit.").replace("-", "_"): v for k, v in values.items()}
    return budget | {name: getattr(args, name) for name in BUDGET_FLAGS if getattr(args, name) is not None}


def main(args: argparse.Namespace) -> int:
    """Exit 0 with the report written, 2 on input the audit cannot use (the message says what to change)."""
    problem = misplaced(args)
    if problem is not None:
        print(f"fedvit audit: {problem}", file=sys.stderr)
        return 2
    try:
        budgets = sorted(set(positive_list(args.budgets, "--budgets"))) if args.budgets else None
        if args.benchmark:
            return benchmark(args, budgets)
        audit_captures(args, budgets)
    except (ValueError, TypeError, FileNotFoundError) as err:  # AuditInputError and SpecError are ValueErrors
        print(f"fedvit audit: {err}", file=sys.stderr)
        return 2
    print(f"audit written to {Path(args.out) / 'audit.md'} and {Path(args.out) / 'audit.html'}")
    return 0


def audit_captures(args: argparse.Namespace, budgets: list[int] | None) -> None:
    """The audit of a capture folder: the flags as :func:`fedvit.audit.api.audit_captures`'s keywords, then the
    verdict and the attacks' means printed."""
    import logging

    from fedvit.audit.api import audit_captures as run

    logging.basicConfig(level=logging.INFO, format="%(message)s")  # the audit's progress and notes
    result = run(
        args.captures,
        out=args.out,
        model=args.model,
        **model_flags(args),
        loss=args.loss,
        app_dir=args.app_dir,
        data=args.data,
        decoy_partitions=args.decoy_partitions,
        num_partitions=args.num_partitions,
        data_options={k: _toml_value(v) for k, v in _pairs(args.data_option, "--data-option").items()} or None,
        canaries=args.canaries,
        app=args.app,
        sent=args.sent or "auto",
        recipe=_pairs(args.recipe, "--recipe") or None,
        fit_check=not args.no_fit_check,
        decoys=args.decoys,
        membership_references=args.membership_references,
        leakage=args.leakage,
        budgets=budgets,
        device=args.device,
        **budget_keywords(args),
    )
    print(result.paths["frontier"].read_text().split("\n## Every attack")[0], flush=True)
    print("verdict:\n" + result.verdict, flush=True)


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


def model_flags(args: argparse.Namespace) -> dict[str, Any]:
    """``--model-arg``, ``--input``, ``--mean``, ``--std`` and ``--partition`` as the audit's keywords (None: not
    given), for ``fedvit audit`` and ``fedvit audit-app``."""
    floats = lambda text: None if not text else [float(v) for v in text.split(",") if v.strip()]  # noqa: E731
    return {
        "model_args": {k: _toml_value(v) for k, v in _pairs(args.model_arg, "--model-arg").items()} or None,
        "input_shape": None if not args.input else [int(v) for v in args.input.split(",")],
        "mean": floats(args.mean),
        "std": floats(args.std),
        "partitions": {k: int(v) for k, v in _pairs(args.partition, "--partition").items()} or None,
    }


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
