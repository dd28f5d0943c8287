"""The audit from Python, with plain types: :func:`audit_captures`. ``fedvit audit`` is a thin layer over it.

Paths are ``str`` or ``os.PathLike``; the model and the data are ``"package.module:name"`` strings or the callables
themselves (top-level functions or classes, so that the audit can name them); the attack budget is keywords. It
prints nothing: progress and notes go to the ``fedvit.audit`` logger (``logging.basicConfig(level=logging.INFO)``
shows them). A ``fedvit-audit.toml`` beside the captures (see ``fedvit audit --help``) fills in what the call leaves
out; the call's values win.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import logging
import os
import tomllib
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedvit.core.budget import DEFAULT_DECOYS, MEMBERSHIP_REFERENCES, check_decoys

if TYPE_CHECKING:  # the summary's types load numpy and scipy: not at `fedvit --help`
    from fedvit.audit.summary import ClientFinding

log = logging.getLogger("fedvit.audit")
SPEC_FILE = "fedvit-audit.toml"
PathText = str | os.PathLike  # a path as str or Path
OUTPUTS = {"json": "audit.json", "markdown": "audit.md", "html": "audit.html", "membership-roc": "membership-roc.png",
           "labels": "labels.png", "grid": "grid.png", "frontier": "frontier.md"}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class AuditResult:
    """What an audit found: the verdict (at most three lines), one finding per client and leakage type, the files
    written (by kind, only those that exist) and the whole report (``audit.json``'s content)."""

    verdict: str
    clients: tuple[ClientFinding, ...]
    paths: dict[str, Path]
    report: dict[str, Any]


def audit_captures(
    captures: PathText,
    *,
    out: PathText = "audit",
    model: str | Callable[..., Any] | None = None,
    model_args: Mapping[str, Any] | None = None,
    input_shape: Sequence[int] | None = None,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    loss: str | None = None,
    app_dir: PathText | None = None,
    data: str | Callable[[int], Any] | None = None,
    partitions: Mapping[str | int, int] | None = None,
    decoy_partitions: str | Iterable[int] | None = None,
    num_partitions: int | None = None,
    data_options: Mapping[str, Any] | None = None,
    canaries: str | Callable[[int], Any] | None = None,
    app: PathText | None = None,
    sent: str = "auto",
    recipe: Mapping[str, Any] | None = None,
    fit_check: bool = True,
    decoys: int = DEFAULT_DECOYS,
    membership_references: int = MEMBERSHIP_REFERENCES,
    budgets: Iterable[int] | None = None,
    device: str | None = None,
    title: str | None = None,
    leakage: str | Iterable[str] | None = None,
    app_facts: Iterable[Mapping[str, str]] = (),
    **budget: Any,
) -> AuditResult:
    """Audit every captured train exchange under ``captures`` and write the report under ``out``.

    - ``model`` (another app's captures; fedvit's name their own): its factory, ``"pkg.task:Net"``, a timm name or
      the callable; ``model_args`` its keyword arguments; ``input_shape`` (C, H, W), ``mean``/``std`` the app's
      normalisation, ``loss`` "cross-entropy" or "nll"; ``app_dir`` the folder to import it (and ``data``) from.
    - ``data``: the clients' images for scoring, ``loader(partition_id) -> (images, labels)`` or a dataset name
      (cifar10, imagefolder:PATH, synthetic); ``partitions`` maps node ids to partitions; ``decoy_partitions``
      (``"4-7"`` or ints) are others' images; ``num_partitions``/``data_options`` for a dataset name
      (``num_partitions`` with a loader: the partitions a node the capture does not map is matched to);
      ``canaries`` a loader of planted canaries.
    - ``app``: the app's code (a folder or FAB) to read the recipe from; ``recipe``: values you know (lr, momentum,
      optimizer, ...); ``sent``: "auto", "gradient" or "weights"; ``fit_check`` False reports what a misfitting
      recipe simulates.
    - the budget: ``iterations``, ``restarts``, ``max_seconds``, ``tv``, ``lr``, ... (``fedvit audit --help``);
      ``budgets`` one row per Adam-step budget; ``device`` "auto", "cpu" or "cuda".
    - ``leakage``: the leakage types to measure, of "labels", "membership" and "images", as names or one
      comma-separated string as ``--leakage`` takes it (default: all); the others are reported "not asked for".
      The label estimate still runs where a membership figure rests on its simulation (the shadow updates and the
      power twin, neither of which runs where canaries are scored).
    - ``app_facts``: rows of what ``fedvit audit-app`` read from the app (``what``, ``value``, ``source``,
      ``side``), printed in the report.

    Raises ``ValueError`` (or its subclasses: fedvit's ``AuditInputError``, ``SpecError``) saying what to change.
    """
    from fedvit.audit.evidence import LEAKAGE_KINDS
    from fedvit.audit.pipeline import AuditOptions, audit_captured
    from fedvit.audit.registry import MeasureOptions

    captures, out = Path(captures), Path(out)
    check_decoys(decoys)
    if sent not in ("auto", "gradient", "weights"):
        raise ValueError(f"sent must be auto, gradient or weights, got {sent!r}")
    kinds = LEAKAGE_KINDS
    if leakage is not None:  # read once: an iterator is consumed, a string is the command line's comma list
        asked = {k.strip() for k in leakage.split(",") if k.strip()} if isinstance(leakage, str) else set(leakage)
        # the report's order; an unknown name is kept for MeasureOptions to refuse it by name
        kinds = tuple(k for k in LEAKAGE_KINDS if k in asked) + tuple(sorted(asked - set(LEAKAGE_KINDS)))
    measures = MeasureOptions(  # checks its values: references >= 0, budgets >= 1, known leakage types
        budgets=None if budgets is None else tuple(sorted({int(b) for b in budgets})),
        references=membership_references,
        fit_check=fit_check,
        leakage=kinds,
    )
    found = find_spec_file(captures) if captures.exists() else None
    values = read_spec_file(found) if found else {}
    if found:
        log.info(f"audit: settings from {found}")
    spec = model_spec(values.get("model", {}), model, model_args, input_shape, mean, std, loss, app_dir)
    options = AuditOptions(
        spec=spec,
        budget=audit_budget(budget),
        tv_by_model="tv" not in budget,
        overrides=recipe_overrides(values.get("recipe", {}), recipe),
        app=None if app is None else existing(app, "app"),
        sent_as=sent,
        data=user_data(values.get("data", {}), data, partitions, decoy_partitions, num_partitions, data_options,
                       canaries, spec, app_dir),  # fmt: skip
        decoys=decoys,
        device=device,
        title=title,
        app_facts=tuple(dict(f) for f in app_facts),
        measures=measures,
    )
    written = audit_captured(captures, out, options)
    report = written.report
    log.info(f"audit: {report['verdict']}")
    clients = tuple(written.audit.findings)
    paths = {kind: out / name for kind, name in OUTPUTS.items() if (out / name).is_file()}
    return AuditResult(report["verdict"], clients, paths, report)


def reference(obj: str | Callable[..., Any], what: str) -> str:
    """``obj`` as ``"module:qualified.name"``: a string as given, a callable by where it is defined (it must be
    found there again: a lambda or a function defined inside another cannot be named)."""
    if isinstance(obj, str):
        return obj
    if not callable(obj):
        raise TypeError(f"{what}: give a 'package.module:name' string or a callable, got {type(obj).__name__}")
    module, name = getattr(obj, "__module__", None), getattr(obj, "__qualname__", "")
    if module and name and "<" not in name:
        try:
            found = functools.reduce(getattr, name.split("."), importlib.import_module(module))
        except (ImportError, AttributeError):
            found = None
        if found is obj:
            return f"{module}:{name}"
    raise TypeError(f"{what}: {obj!r} cannot be named as module:name (a lambda or a nested function?): give a "
                    "top-level function or class, or its 'package.module:name' string")  # fmt: skip


def existing(path: PathText, what: str) -> Path:
    """``path`` as a Path that exists, else a ValueError naming ``what``."""
    path = Path(path)
    if not path.exists():
        raise ValueError(f"{what} {path}: no such folder or file")
    return path


def audit_budget(budget: Mapping[str, Any]) -> Any:
    """The attack budget from keywords (``audit.*`` names with underscores), validated as the run config's
    ``audit.*`` is; None without any (a fedvit run's own ``audit.*``, another app's defaults by model)."""
    from fedvit.core.config import ConfigError, parse_config

    if not budget:
        return None
    try:
        return parse_config({f"audit.{k.replace('_', '-')}": v for k, v in budget.items()}).audit
    except ConfigError as err:
        raise ValueError(f"budget: {err}") from None


def model_spec(
    table: Mapping[str, Any], model: str | Callable[..., Any] | None, model_args: Mapping[str, Any] | None,
    input_shape: Sequence[int] | None, mean: Sequence[float] | None, std: Sequence[float] | None, loss: str | None,
    app_dir: PathText | None,
) -> Any:  # fmt: skip
    """Another app's model from the TOML's ``[model]`` and the call's values (which win); None without a model."""
    values = dict(table)
    given = {"factory": None if model is None else reference(model, "model"), "loss": loss,
             "app-dir": None if app_dir is None else str(app_dir), "input": input_shape, "mean": mean, "std": std}
    values |= {k: (list(v) if isinstance(v, Sequence) and not isinstance(v, str) else v) for k, v in given.items()
               if v is not None}  # fmt: skip
    values["args"] = dict(values.get("args", {})) | dict(model_args or {})
    if not values.get("factory"):
        named = [k for k, v in given.items() if v is not None] + (["model_args"] if model_args else [])
        if named:
            raise ValueError(f"{', '.join(named)} describe the model: give model (--model) as well")
        return None
    return spec_from(values)


def recipe_overrides(table: Mapping[str, Any], recipe: Mapping[str, Any] | None) -> dict[str, str]:
    """Recipe values the user knows (the TOML's ``[recipe]``, then the call's), checked against the known keys."""
    from fedvit.observed.recipe import AUGMENT_KEYS, LOCAL_DP_KEYS, OPTIMISER_KEYS, PRIVACY_KEYS, RECIPE_KEYS

    overrides = {str(k): str(v) for k, v in table.items()} | {str(k): str(v) for k, v in (recipe or {}).items()}
    known = {name for key, aliases in RECIPE_KEYS.items() for name in (key, *aliases)} | {
        *OPTIMISER_KEYS, *AUGMENT_KEYS} | {name for keys in (PRIVACY_KEYS, LOCAL_DP_KEYS) for names in keys.values()
                                           for name in names}  # fmt: skip
    if unknown := sorted(set(overrides) - known):
        choices = ", ".join(sorted(known))
        raise ValueError(f"recipe (--recipe) {', '.join(unknown)}: not a recipe key (one of {choices})")
    return overrides


def user_data(
    table: Mapping[str, Any], data: str | Callable[[int], Any] | None, partitions: Mapping[str | int, int] | None,
    decoy_partitions: str | Iterable[int] | None, num_partitions: int | None, data_options: Mapping[str, Any] | None,
    canaries: str | Callable[[int], Any] | None, spec: Any, app_dir: PathText | None,
) -> Any:  # fmt: skip
    """The scoring data from the call and the TOML's ``[data]`` (the call wins); None without any."""
    from fedvit.audit.user_data import UserData
    from fedvit.core.config import is_dataset_name, parse_selection

    loader = data if callable(data) and hasattr(data, "reference") else None  # audit-app's AppLoader, in-process
    if loader is not None:
        source = loader.reference
    else:
        source = reference(data, "data") if data is not None else table.get("loader") or table.get("name")
    if not source:
        named = [n for n, v in (("partitions (--partition)", partitions), ("num_partitions (--num-partitions)",
                 num_partitions), ("data_options (--data-option)", data_options), ("decoy_partitions "
                 "(--decoy-partitions)", decoy_partitions), ("canaries (--canaries)", canaries)) if v]  # fmt: skip
        if named:
            raise ValueError(f"{', '.join(named)}: these describe the clients' data: give data (--data) as well")
        return None
    source = str(source)
    settings = {str(k): v for k, v in table.get("settings", {}).items()} | dict(data_options or {})
    count = num_partitions or table.get("num-partitions")
    decoys = decoy_partitions if decoy_partitions is not None else table.get("decoy-partitions", "")
    if not is_dataset_name(source) and settings:
        raise ValueError(f"data_options apply to a dataset name, not the loader {source}")
    if is_dataset_name(source) and decoys:
        raise ValueError("decoy_partitions applies to a loader; a dataset name's decoys are its test split")
    if count is not None and int(count) < 1:
        raise ValueError(f"num_partitions must be at least 1, got {count}")
    shape = spec.input_shape if spec is not None else None
    if is_dataset_name(source) and shape is not None and shape[1] != shape[2]:
        raise ValueError(f"data {source} serves square images; the model's input is {shape}")
    mapping = {str(k): int(v) for k, v in table.get("partitions", {}).items()}
    mapping |= {str(k): int(v) for k, v in (partitions or {}).items()}
    chosen = parse_selection(decoys) if isinstance(decoys, str) else {int(p) for p in decoys}
    found = UserData(
        source, mapping, tuple(sorted(chosen or ())), spec.app_dir if spec else (None if app_dir is None else
        str(app_dir)), settings, None if count is None else int(count), shape[1] if shape else 32,
        None if canaries is None else reference(canaries, "canaries") if not isinstance(canaries, str) else canaries,
        loader=loader,
    )  # fmt: skip
    if found.named:
        found.config()  # a wrong data.* setting fails here, before any attack runs
    return found


def read_spec_file(path: Path) -> dict[str, Any]:
    """A ``fedvit-audit.toml``: its ``[model]`` table checked, ``app-dir`` made relative to the file; the other
    tables (``recipe``, ``data``) returned under their names."""
    from fedvit.observed.model_spec import SpecError

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


def spec_from(values: Mapping[str, Any]) -> Any:
    """A :class:`~fedvit.observed.model_spec.ModelSpec` from ``[model]``-style keys (TOML names)."""
    from fedvit.observed.model_spec import ModelSpec, SpecError

    if not values.get("factory"):
        raise SpecError(f"no model given: pass --model package.module:factory (or a timm name) or write {SPEC_FILE}")
    kwargs: dict[str, Any] = {"factory": str(values["factory"])}
    if "input" in values:
        kwargs["input_shape"] = tuple(int(v) for v in values["input"])
    channels = kwargs.get("input_shape", (3,))[0]
    for key in ("mean", "std"):
        v = values.get(key, 0.5)  # the default 0.5 per channel, for any channel count
        kwargs[key] = tuple(float(x) for x in (v if isinstance(v, list | tuple) else [v] * channels))
    kwargs["stated"] = "mean" in values or "std" in values  # else the defaults, checked against the app's code
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
