"""``fedvit audit-app [APP_DIR]``: audit a Flower app in one command. It runs the app as a Flower simulation with
``capture_mod`` wrapped around its ClientApp in a staged copy (the user's files are never edited), reads from the
app's code what the audit needs (the model and its arguments, the normalisation, the loader its clients call; each
with its source), calls that loader for scoring on the auditor's side, and audits the capture. ``--captures DIR``
audits an existing capture instead of running; ``--fail-on`` makes the result a CI gate (exit 1 where a named
leakage type is found).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import tomli_w

from fedvit.capture.writer import CAPTURE_DIR_KEY

WRAPPER_MODULE = "fedvit_audited_clientapp"  # the staged copy's clientapp component: the user's, captured
FLOWER_DEFAULT_SUPERNODES = 2  # Flower's own default for a local simulation (since flwr 1.32)
ATTACKER, AUDITOR = "attacker and auditor", "auditor only (scoring)"


class AuditAppError(ValueError):
    """Input ``fedvit audit-app`` cannot use; the message names the flag or file that fixes it."""


@dataclasses.dataclass(frozen=True)
class Project:
    """An app's ``pyproject.toml`` as ``flwr run`` reads it."""

    folder: Path
    clientapp: str
    config: dict[str, Any]
    supernodes: tuple[int, str]  # (count, where it is stated)


def read_project(app_dir: Path) -> Project:
    """The app's components, config and simulated SuperNodes (the app's own federation, else Flower's local
    configuration, else Flower's default), or an AuditAppError naming what is missing."""
    path = app_dir / "pyproject.toml"
    if not path.is_file():
        raise AuditAppError(f"{app_dir}: no pyproject.toml (a Flower app declares [tool.flwr.app.components] there)")
    flwr = tomllib.loads(path.read_text()).get("tool", {}).get("flwr", {})
    components = flwr.get("app", {}).get("components", {})
    if "clientapp" not in components or "serverapp" not in components:
        raise AuditAppError(f"{path}: [tool.flwr.app.components] must name serverapp and clientapp")
    return Project(app_dir, str(components["clientapp"]), dict(flwr.get("app", {}).get("config", {})),
                   stated_supernodes(flwr, path))  # fmt: skip


def stated_supernodes(flwr: Mapping[str, Any], pyproject: Path) -> tuple[int, str]:
    """How many SuperNodes the app's simulation federation or Flower's local SuperLink configuration states."""
    federations = flwr.get("federations", {})
    name = federations.get("default")
    options = federations.get(name, {}).get("options", {}) if isinstance(name, str) else {}
    if "num-supernodes" in options:
        return int(options["num-supernodes"]), f"{pyproject.name} [tool.flwr.federations.{name}]"
    from fedvit.app.flower_processes import flwr_home

    config = flwr_home() / "config.toml"
    if config.is_file():
        superlinks = tomllib.loads(config.read_text()).get("superlink", {})
        local = superlinks.get(str(superlinks.get("default", "local")), {})
        if local.get("address") == ":local:" and "num-supernodes" in local.get("options", {}):
            return int(local["options"]["num-supernodes"]), f"{config} [superlink.{superlinks.get('default')}]"
    return FLOWER_DEFAULT_SUPERNODES, "Flower's default for a local simulation"


def stage_with_capture(project: Project, into: Path) -> Path:
    """A copy of the app's bundle files under ``into`` whose clientapp component is the user's ClientApp with
    ``capture_mod`` outermost (:func:`fedvit.capture.writer.captured`) and whose config declares
    ``fedvit-capture-dir`` (Flower refuses overrides of undeclared keys)."""
    from fedvit.app.app_files import staged_app

    staged = staged_app(project.folder, into)
    module, _, attr = project.clientapp.partition(":")
    (staged / f"{WRAPPER_MODULE}.py").write_text(
        f'"""Written by fedvit audit-app in a staged copy: {project.clientapp} with capture_mod outermost."""\n\n'
        f"from fedvit.capture.writer import captured\nfrom {module} import {attr} as audited\n\n"
        "app = captured(audited)\n"
    )
    pyproject = tomllib.loads((staged / "pyproject.toml").read_text())
    app = pyproject["tool"]["flwr"]["app"]
    app["components"]["clientapp"] = f"{WRAPPER_MODULE}:app"
    app.setdefault("config", {})[CAPTURE_DIR_KEY] = ""
    (staged / "pyproject.toml").write_text(tomli_w.dumps(pyproject))
    return staged


def run_captured(project: Project, captures: Path, rounds: int | None, supernodes: int,
                 overrides: Sequence[str]) -> None:  # fmt: skip
    """The app as a Flower simulation of its own (a private local SuperLink, stopped after), recorded by
    capture_mod into ``captures``; an AuditAppError where the run does not complete."""
    from fedvit.app.flower_processes import (
        flower_env,
        flwr_executable,
        private_superlink_env,
        relay,
        start_local_superlink,
        stop_local_superlink,
    )
    from fedvit.app.run_config import flatten, merge_overrides, write_overrides

    values = merge_overrides(overrides)
    unknown = sorted(set(values) - set(flatten(project.config)))
    if unknown:
        raise AuditAppError(f"-c {', '.join(unknown)}: not in the app's [tool.flwr.app.config] (Flower refuses them)")
    if rounds is not None:
        if "num-server-rounds" not in project.config:
            raise AuditAppError("--rounds: the app's config has no num-server-rounds key; set its own key with -c")
        values["num-server-rounds"] = rounds
    elif "num-server-rounds" in project.config and "num-server-rounds" not in values:
        values["num-server-rounds"] = 1  # a laptop's default: one round of the app's own settings
    told = values.get("num-server-rounds", "the app's own count of")
    print(f"fedvit audit-app: {told} round(s), captured to {captures}", flush=True)
    values[CAPTURE_DIR_KEY] = str(captures.resolve())
    with tempfile.TemporaryDirectory(prefix="fedvit-audit-app-") as tmp:
        work = Path(tmp)
        staged = stage_with_capture(project, work / "app")
        home = work / "flwr-home"
        env = flower_env(private_superlink_env(home)) | {"FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1"}
        cmd = [flwr_executable(), "run", str(staged), "--stream", "--federation-config",
               f"num-supernodes={supernodes} client-resources-num-cpus=1", "--run-config",
               str(write_overrides(values, work / "run-config.toml"))]  # fmt: skip
        print("$", " ".join(cmd), flush=True)
        printed: list[str] = []
        try:
            start_local_superlink(env)  # flwr run's own wait for it (15 s) is too short on a busy laptop
            code = relay(cmd, env, printed)
        except RuntimeError as error:
            raise AuditAppError(str(error)) from error
        finally:
            stop_local_superlink(home)
    if code != 0 or not any(captures.rglob("node-*.json")):
        raise AuditAppError(f"the app's simulation did not complete (flwr run exit {code}; its output is above)")


# ---------------------------------------------------------------------------- what the audit reads from the app


@dataclasses.dataclass
class Discovered:
    """The audit's inputs as read from the app (or given by flags), and the report's rows saying where from."""

    keywords: dict[str, Any]
    facts: list[dict[str, str]] = dataclasses.field(default_factory=list)
    # the loader's images come normalised (a Normalize transform, or --mean/--std): undone for scoring; a
    # normalisation the code writes out, (x - MEAN) / STD, is applied to batches, not in the loader
    normalised_by_loader: bool = True

    def fact(self, what: str, value: Any, source: str, side: str) -> None:
        self.facts.append({"what": what, "value": str(value), "source": source, "side": side})


def discover(app_dir: Path, captures: Path, given: Mapping[str, Any]) -> Discovered:
    """:func:`fedvit.audit_captures`'s model and data keywords from the app's code and the capture; ``given`` (the
    flags the user gave: model, model_args, mean, std, input_shape, data, partitions, supernodes) wins. An
    AuditAppError names the flag for each value that could be read neither way."""
    from fedvit.capture.reader import load_exchanges
    from fedvit.observed.app_code import AppCodeError, load_app

    exchanges, _ = load_exchanges(captures)
    if not exchanges:
        raise AuditAppError(f"no captured train exchanges under {captures}")
    run_config = dict(exchanges[0].run_config)
    run_config.pop(CAPTURE_DIR_KEY, None)
    try:
        app = load_app(app_dir)
    except AppCodeError as err:
        raise AuditAppError(str(err)) from None
    found = Discovered({"app_dir": str(app_dir), "app": app_dir})
    discover_model(found, app, run_config, given)
    discover_normalisation(found, app, run_config, given)
    recorded = [int(ex.partition) for ex in exchanges if ex.partition is not None]
    partitions = max((ex.num_partitions or 0 for ex in exchanges), default=0) or int(given.get("supernodes") or 0) \
        or (1 + max(recorded) if recorded else 0)  # fmt: skip
    if partitions < 1:
        raise AuditAppError("the capture records no partitions and no SuperNode count is known: give --supernodes")
    discover_data(found, app, run_config, given, partitions, sorted(set(recorded)) or list(range(partitions)))
    discover_partitions(found, exchanges, given, partitions)
    return found


def discover_model(found: Discovered, app: Any, run_config: dict[str, Any], given: Mapping[str, Any]) -> None:
    """The model the ClientApp trains and its arguments (``--model`` wins)."""
    from fedvit.observed.app_facts import read_model

    if given.get("model"):
        found.keywords["model"], found.keywords["model_args"] = given["model"], given.get("model_args")
        found.fact("model", given["model"], "--model", ATTACKER)
        return
    model = read_model(app, run_config)
    if not model.read:
        raise AuditAppError(f"the model the ClientApp trains is not read from its code ({model.factory.source}: "
                            f"{model.unread_reason()}): give --model package.module:factory "
                            "(and --model-arg KEY=VALUE)")  # fmt: skip
    args = {k: v.value for k, v in model.args.items()} | dict(given.get("model_args") or {})
    found.keywords["model"], found.keywords["model_args"] = model.factory.value, args or None
    call = ", ".join(f"{k}={v!r}" for k, v in args.items())
    found.fact("model", f"{model.factory.value}({call})", model.factory.source, ATTACKER)


def discover_normalisation(found: Discovered, app: Any, run_config: dict[str, Any], given: Mapping[str, Any]) -> None:
    """The mean and std of the app's Normalize (``--mean``/``--std`` win)."""
    from fedvit.observed.app_facts import read_normalisation

    for name, value in zip(("mean", "std"), read_normalisation(app, run_config), strict=True):
        if given.get(name) is not None:
            found.keywords[name] = list(given[name])
            found.fact(name, tuple(given[name]), f"--{name}", ATTACKER)
        elif not value.read:
            raise AuditAppError(f"the app's normalisation is not read from its code ({value.source}: {value.how}): "
                                "give --mean and --std")  # fmt: skip
        else:
            found.keywords[name] = list(value.value)
            found.fact(name, value.value, f"{value.source}, {value.how}", ATTACKER)
            found.normalised_by_loader = found.normalised_by_loader and "written out" not in value.how


def discover_data(found: Discovered, app: Any, run_config: dict[str, Any], given: Mapping[str, Any],
                  partitions: int, held: list[int]) -> None:  # fmt: skip
    """The clients' loader, the decoys and non-members, and the input size from the loader's images (``--data``
    and ``--input`` win); a one-channel Normalize broadcast over the input's channels."""
    from fedvit.audit.app_loader import AppLoader
    from fedvit.observed.app_facts import LoaderCall, read_loader

    keywords = found.keywords
    if given.get("data"):
        keywords["data"] = given["data"]
        found.fact("clients' data", given["data"], "--data", AUDITOR)
    else:
        call = read_loader(app)
        if not isinstance(call, LoaderCall):
            raise AuditAppError(f"the clients' data loader is not read from the app's code ({call.source}: "
                                f"{call.how}): give --data package.module:loader")  # fmt: skip
        loader = AppLoader(call, str(keywords["app_dir"]), run_config, partitions, tuple(keywords["mean"]),
                           tuple(keywords["std"]), undo=found.normalised_by_loader)  # fmt: skip
        keywords["data"] = loader
        found.fact("clients' data", f"{call.function}, called with each partition", call.source, AUDITOR)
        unsampled = [p for p in range(partitions) if p not in held]
        decoys = list(unsampled)
        try:
            loader(partitions + held[0])
            decoys += [partitions + p for p in range(partitions)]
            found.fact("decoys and non-members", f"partitions no sampled client held: {unsampled or 'none'}; the "
                       f"held-out split (the loader's second value) of every partition, as partitions {partitions}–"
                       f"{2 * partitions - 1}", call.source, AUDITOR)  # fmt: skip
        except ValueError as err:
            instead = "" if unsampled else "; each client's are the other sampled clients' partitions"
            found.fact("decoys and non-members", f"partitions no sampled client held: {unsampled or 'none'} ({err})"
                       f"{instead}", call.source, AUDITOR)  # fmt: skip
        if decoys:
            keywords["decoy_partitions"] = decoys
        if given.get("input_shape") is None:
            images, _ = loader(held[0])
            keywords["input_shape"] = list(images.shape[1:])
            found.fact("input", "×".join(map(str, images.shape[1:])), f"the first partition's images from "
                       f"{call.function}", ATTACKER)  # fmt: skip
    if given.get("input_shape") is not None:
        keywords["input_shape"] = list(given["input_shape"])
        found.fact("input", tuple(given["input_shape"]), "--input", ATTACKER)
    elif "input_shape" not in keywords:
        raise AuditAppError("the input size is read from the app's loader, which --data replaced: give --input C,H,W")
    if len(keywords["mean"]) == 1 and keywords["input_shape"][0] > 1:  # Normalize((0.5,), (0.5,)) broadcasts
        keywords["mean"] = keywords["mean"] * keywords["input_shape"][0]
        keywords["std"] = keywords["std"] * keywords["input_shape"][0]


def discover_partitions(found: Discovered, exchanges: list[Any], given: Mapping[str, Any], partitions: int) -> None:
    """Which partition each node held: ``--partition``, else the capture's partition ids, else matched."""
    if given.get("partitions"):
        found.keywords["partitions"] = dict(given["partitions"])
        found.fact("node → partition", ", ".join(f"{n} → {p}" for n, p in found.keywords["partitions"].items()),
                   "--partition", AUDITOR)  # fmt: skip
    elif all(ex.partition is not None for ex in exchanges):
        nodes = {str(ex.node): ex.partition for ex in exchanges}
        found.fact("node → partition", ", ".join(f"{n} → {p}" for n, p in sorted(nodes.items(), key=lambda x: x[1])),
                   "the capture (capture_mod records each node's partition-id)", AUDITOR)  # fmt: skip
    else:  # a tap's capture: no node config; the audit matches each node to the partition its update fits
        found.keywords["num_partitions"] = partitions
        found.fact("node → partition", f"matched by the audit to partitions 0–{partitions - 1} (its notes give "
                   "each node's fit and runner-up)", "each node's update: its label fit (node_matching)",
                   AUDITOR)  # fmt: skip


def audit_app(
    app_dir: str | Path = ".",
    *,
    out: str | Path = "fedvit-audit",
    captures: str | Path | None = None,
    rounds: int | None = None,
    supernodes: int | None = None,
    run_config: Iterable[str] = (),
    model: str | None = None,
    model_args: Mapping[str, Any] | None = None,
    input_shape: Sequence[int] | None = None,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    data: str | None = None,
    partitions: Mapping[str, int] | None = None,
    **audit: Any,
) -> Any:
    """Run the Flower app at ``app_dir`` as a simulation with ``capture_mod`` around its ClientApp (``rounds`` of
    it, default 1 where the app declares ``num-server-rounds``, else its own count; on ``supernodes`` SuperNodes;
    ``run_config`` as ``-c``), or take ``captures``, and audit it with what its
    code states (see the module docstring); the flags' values (``model``, ``mean``, ...) win over what is read.
    ``audit``: further keywords of :func:`fedvit.audit_captures` (budget, leakage, ...). Returns its
    :class:`fedvit.AuditResult`; raises ``ValueError`` saying what to give."""
    from fedvit.audit.api import audit_captures

    app_dir, out = Path(app_dir).resolve(), Path(out)
    project = read_project(app_dir)
    if captures is None:
        count, where = (supernodes, "--supernodes") if supernodes is not None else project.supernodes
        if count < 1:
            raise AuditAppError("--supernodes must be at least 1")
        print(f"fedvit audit-app: running {app_dir.name} on {count} simulated SuperNodes ({where})", flush=True)
        captures = out / "captures"
        if captures.exists() and any(captures.iterdir()):
            raise AuditAppError(f"{captures} holds an earlier capture: audit it with --captures {captures}, or "
                                "give another --out")  # fmt: skip
        run_captured(project, captures, rounds, count, list(run_config))
    captures = Path(captures)
    given = {"model": model, "model_args": model_args, "input_shape": input_shape, "mean": mean, "std": std,
             "data": data, "partitions": partitions,
             "supernodes": supernodes if supernodes is not None else project.supernodes[0]}  # fmt: skip
    found = discover(app_dir, captures, given)
    for f in found.facts:
        print(f"fedvit audit-app: {f['what']}: {f['value']} ({f['source']}; {f['side']})", flush=True)
    return audit_captures(captures, out=out, app_facts=found.facts, **found.keywords, **audit)


# ---------------------------------------------------------------------------- the command


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("audit-app", help="run a Flower app as a captured simulation and audit it, in one command",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("app", nargs="?", default=".", type=Path, help="the app's folder (default: .)")
    p.add_argument("--out", type=Path, default=Path("fedvit-audit"), help="where the capture and the report go "
                   "(default: ./fedvit-audit)")  # fmt: skip
    p.add_argument("--captures", type=Path, help="audit this capture (a capture_mod folder or a `fedvit tap` "
                   "output) instead of running the app")  # fmt: skip
    p.add_argument("--rounds", type=int, help="num-server-rounds of the run (default 1; an app without that key "
                   "runs its own count)")  # fmt: skip
    p.add_argument("--supernodes", type=int, help="simulated SuperNodes (default: as the app's federation or Flower's "
                   "local configuration states, else Flower's default, 2)")  # fmt: skip
    p.add_argument("-c", "--run-config", action="append", default=[], help="KEY=VALUE of the app's config (repeatable)")
    p.add_argument("--fail-on", help="exit 1 when one of these is found: labels, membership, images, dp, any; add "
                   "unverified to fail where a named type could not have been seen (a CI gate)")  # fmt: skip
    g = p.add_argument_group("what the audit otherwise reads from the app's code")
    g.add_argument("--model", help="package.module:factory of the model the ClientApp trains")
    g.add_argument("--model-arg", action="append", default=[], help="KEY=VALUE: a keyword argument of the factory")
    g.add_argument("--input", help="C,H,W of the client's images")
    g.add_argument("--mean", help="per-channel mean of the app's Normalize")
    g.add_argument("--std", help="per-channel std of the app's Normalize")
    g.add_argument("--data", help="package.module:loader, loader(partition_id) -> (images in [0, 1], labels)")
    g.add_argument("--partition", action="append", default=[], help="NODE=PARTITION: which partition a node holds "
                   "(default: the capture's partition-id, else matched by each update's label fit)")  # fmt: skip
    g = p.add_argument_group("budget")
    g.add_argument("--iterations", type=int, help="Adam steps per restart (default 1500)")
    g.add_argument("--restarts", type=int, help="random starts (default 2)")
    g.add_argument("--max-seconds", type=float, help="wall-clock cap per update (default 90)")
    g.add_argument("--leakage", help="comma-separated leakage types to measure (default: all)")
    g.add_argument("--membership-references", type=int, help="shadow updates behind the shadow-alignment score")


def main(args: argparse.Namespace) -> int:
    """Exit 0 (the gate passed or none was asked), 1 (``--fail-on`` found a named leakage type), 2 (bad input)."""
    import logging

    from fedvit.app.audit_cli import model_flags
    from fedvit.audit.gate import judge, parse_fail_on

    try:
        gate = parse_fail_on(args.fail_on) if args.fail_on else None
        budget = {k: getattr(args, k) for k in ("iterations", "restarts", "max_seconds", "leakage",
                                                "membership_references") if getattr(args, k) is not None}  # fmt: skip
        logging.basicConfig(level=logging.INFO, format="%(message)s")
        result = audit_app(
            args.app, out=args.out, captures=args.captures, rounds=args.rounds, supernodes=args.supernodes,
            run_config=args.run_config, model=args.model, data=args.data, **model_flags(args), **budget,
        )  # fmt: skip
    except (ValueError, TypeError, FileNotFoundError) as err:
        print(f"fedvit audit-app: {err}", file=sys.stderr)
        return 2
    print("verdict:\n" + result.verdict, flush=True)
    print(f"audit written to {args.out / 'audit.md'} and {args.out / 'audit.html'}")
    if gate is None:
        return 0
    failed, lines = judge(gate, result.clients, result.report["together"])
    for line in lines:
        print(f"fedvit audit-app: {line}")
    print(f"fedvit audit-app: --fail-on {args.fail_on}: {'FAILED' if failed else 'passed'}")
    return 1 if failed else 0
