"""``fedvit`` command line: validated ``flwr run`` with Flower's traps handled, config check, SuperLink stop."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import fedvit
from fedvit.app import audit_app, audit_cli
from fedvit.app.deployment import cli as deployment_cli
from fedvit.app.flower_processes import (
    flower_env,
    flwr_executable,
    flwr_home,
    local_address,
    relay,
    run_status,
    start_local_superlink,
    stop_local_superlink,
    superlink_pids,
)
from fedvit.app.run_config import check_config, merge_overrides, resolved_run_config, write_overrides
from fedvit.core.config import ConfigError, parse_config

DEFAULT_FEDERATION = "num-supernodes=5 client-resources-num-cpus=1"
RUN_STARTED = re.compile(r"Successfully started run (\d+)")
REATTACH_S = 600.0  # how long `fedvit run` waits for a SuperLink that stopped answering mid-run


def flwr_run_command(args: argparse.Namespace, override_file: Path, app: Path | None = None) -> list[str]:
    """The ``flwr run`` call for ``fedvit run``: every ``-c`` merged key by key into one ``override_file``;
    ``app``: the folder to bundle (default: the app's own)."""
    local = args.superlink is None or args.superlink == "local"
    cmd = [flwr_executable(), "run", str(app or args.app), *([args.superlink] if args.superlink else []), "--stream"]
    overrides = merge_overrides(args.run_config)
    if overrides:
        cmd += ["--run-config", str(write_overrides(overrides, override_file))]
    if local:
        cmd += ["--federation-config", args.federation_config]
    return cmd


def run(args: argparse.Namespace) -> int:
    """``flwr run <app> --stream`` after a local config check; the exit code reflects the run's status."""
    app_dir = Path(args.app)
    local = args.superlink is None or args.superlink == "local"
    code = check_config(app_dir, args.run_config, local_data=local)
    if code:
        return code
    env = flower_env()
    no_install = env["FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"] == "1"  # unless the user asked otherwise
    setting = "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1"
    flag = "--disable-runtime-dependency-installation"
    stale = superlink_pids(flwr_home(), with_env=setting, or_flag=flag) if local and no_install else []
    if stale:
        print(
            f"fedvit: the local SuperLink (pid {stale[0]}) was started without "
            "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1 and would re-install torch for every run; "
            "stop it with 'fedvit stop-superlink' and run again",
            file=sys.stderr,
        )
        return 2
    if args.ray_address:
        code = join_ray_cluster(args.ray_address, local, env)
        if code:
            return code
    address = local_address(flwr_home(), args.superlink) if local else None
    if address is not None:
        try:  # before flwr run, whose own wait for it (15 s) a busy machine outlasts
            start_local_superlink(env, in_memory=address == ":local-in-memory:")
        except RuntimeError as error:
            print(f"fedvit run: {error}", file=sys.stderr)
            return 1
    with tempfile.TemporaryDirectory(prefix="fedvit-run-") as tmp:
        staged = None
        if app_dir.is_dir():  # flwr run would list every file under the folder, virtual environments included
            from fedvit.app.app_files import staged_app  # flwr's CLI modules: only for a run

            staged = staged_app(app_dir, Path(tmp) / "app")
            print(f"fedvit: the files of {app_dir} that its bundle (FAB) can hold, staged in {staged}", flush=True)
        cmd = flwr_run_command(args, Path(tmp) / "run-config.toml", staged)
        print("$", " ".join(cmd), flush=True)
        printed: list[str] = []
        code = relay(cmd, env, printed)
        run_id = next((m.group(1) for line in printed if (m := RUN_STARTED.search(line))), None)
    if run_id is None:  # nothing was submitted: flwr's own error is above
        return code or 1
    status = follow_run(run_id, args.superlink, env, printed)
    if status != "finished:completed":
        print_missed_log(run_id, args.superlink, env, printed)
    print(f"fedvit: run {run_id} {status}", flush=True)
    return 0 if status == "finished:completed" else 1


def follow_run(run_id: str, superlink: str | None, env: dict[str, str], printed: list[str]) -> str:
    """The run's final status. When the log stream ended before the run did (the SuperLink restarted, the network
    dropped), the run may go on without us: ask for its status until the SuperLink answers again and re-attach to
    its log; give up only after :data:`REATTACH_S` without an answer."""
    unanswered_since = None
    while not (status := run_status(run_id, superlink, env)).startswith("finished"):
        if status.startswith("unknown"):  # no answer from the SuperLink
            unanswered_since = unanswered_since or time.monotonic()
            if time.monotonic() - unanswered_since > REATTACH_S:
                return f"{status}: no answer from the SuperLink for {REATTACH_S:.0f} s; the run may still go on"
            time.sleep(5.0)
            continue
        unanswered_since = None
        print(f"fedvit: the log stream of run {run_id} ended while it is {status}; re-attaching", flush=True)
        relay([flwr_executable(), "log", run_id, *([superlink] if superlink else []), "--stream"], env, printed)
    return status


def print_missed_log(run_id: str, superlink: str | None, env: dict[str, str], printed: list[str]) -> None:
    """A run that did not complete: print the end of its log that the stream missed (a stream cut by a SuperLink
    restart ends before the ServerApp's last lines, which say why it stopped)."""
    cmd = [flwr_executable(), "log", run_id, *([superlink] if superlink else []), "--show"]
    try:
        shown = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False, timeout=60).stdout
    except subprocess.TimeoutExpired:
        print(f"fedvit: the log of run {run_id} did not come within 60 s; see 'flwr log {run_id} --show'", flush=True)
        return
    missed = unprinted_tail(shown.splitlines(), printed)
    if missed:
        print(f"fedvit: the end of run {run_id}'s log, which the stream missed:", flush=True)
        print("\n".join(missed), flush=True)


def unprinted_tail(log: list[str], printed: list[str]) -> list[str]:
    """The lines of ``log`` from the first one the stream did not print: ``log``'s lines are matched in order
    against ``printed`` (which also holds the CLI's own lines, and the log again after a re-attach)."""
    header = next((i for i, line in enumerate(log) if "logstream for run_id" in line), -1)  # flwr's, not the run's
    log, at = log[header + 1 :], 0
    for i, line in enumerate(log):
        try:
            at = printed.index(line.rstrip("\n"), at) + 1
        except ValueError:
            return [rest for rest in log[i:] if rest.strip()]
    return []


def join_ray_cluster(address: str, local: bool, env: dict[str, str]) -> int:
    """Point the simulation's Ray backend at a running cluster: Flower 1.41 calls ``ray.init()`` without an
    address (its init-args carry none), and Ray then joins the cluster named by ``RAY_ADDRESS``. The variable must
    be in the environment of the local SuperLink, which ``flwr run`` starts once and then keeps."""
    if not local:
        print("fedvit run: --ray-address is for simulations; a deployment scales out with SuperNodes", file=sys.stderr)
        return 2
    setting = f"RAY_ADDRESS={address}"
    stale = superlink_pids(flwr_home(), with_env=setting)
    if stale:
        print(
            f"fedvit run: the local SuperLink (pid {stale[0]}) was started without {setting}, so its simulations "
            "would start a Ray instance of their own; stop it with 'fedvit stop-superlink' and run again",
            file=sys.stderr,
        )
        return 2
    env["RAY_ADDRESS"] = address
    env.setdefault("RAY_DEDUP_LOGS", "0")  # Ray folds log lines that differ only in numbers: keep each placement
    print(f"fedvit: the simulation joins the Ray cluster at {address}", flush=True)
    return 0


def keys(args: argparse.Namespace) -> int:
    """``fedvit keygen`` / ``fedvit decrypt`` (client-side tools: the server never runs them)."""
    from fedvit.clients.encryption import EncryptionKey, EncryptionKeyError, decrypt_file, keygen

    try:
        if args.command == "decrypt":
            print(f"decrypted model: {decrypt_file(args.model, EncryptionKey.load(args.key), args.out)}")
            return 0
        if check_config(Path(args.app), args.run_config, local_data=False):  # the key needs the model only
            return 2
        config = parse_config(resolved_run_config(Path(args.app), args.run_config))
        path = keygen(config.model, args.out, args.seed, args.force)
    except (EncryptionKeyError, OSError) as err:
        print(f"fedvit {args.command}: {err}", file=sys.stderr)
        return 2
    key = EncryptionKey.load(path)
    print(f"key for L={key.patch_dim}, N={key.num_patches} written to {path} (owner-only); give it to every client,")
    print("never to the server: simulation clients find it there, deployed ones via --node-config 'encryption-key=...'")
    return 0


def flwr_version() -> str:
    """The installed Flower's version, read without importing it."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("flwr")
    except PackageNotFoundError:
        return "not installed"


def build_parser() -> argparse.ArgumentParser:
    """The ``fedvit`` command line: every subcommand and its options (the docs' CLI reference is tested against it)."""
    parser = argparse.ArgumentParser(prog="fedvit", description=__doc__)
    parser.add_argument("--version", action="version", version=f"fedvit {fedvit.__version__} (Flower {flwr_version()})")
    sub = parser.add_subparsers(dest="command", required=True)

    p_run = sub.add_parser("run", help="run the app with flwr (streams logs; non-zero exit if the run failed)")
    p_run.add_argument("app", nargs="?", default=".", help="the app folder (default: .)")
    p_run.add_argument("superlink", nargs="?", default=None, help="connection name from $FLWR_HOME/config.toml")
    p_run.add_argument("-c", "--run-config", action="append", default=[], help="key=value ... or a TOML file")
    p_run.add_argument(
        "--federation-config", default=DEFAULT_FEDERATION, help=f"simulation settings (default: {DEFAULT_FEDERATION!r})"
    )
    p_run.add_argument(
        "--ray-address",
        default=None,
        help="simulate on a running Ray cluster: its head's address (host:port, as `ray start --head` prints it)",
    )

    p_check = sub.add_parser(
        "check-config", help="validate the run config without running (an imagefolder: path must exist here)"
    )
    p_check.add_argument("app", nargs="?", default=".", help="the app folder (default: .)")
    p_check.add_argument("-c", "--run-config", action="append", default=[], help="key=value ... or a TOML file")

    p_key = sub.add_parser("keygen", help="create the clients' encryption key file for a model config")
    p_key.add_argument("app", nargs="?", default=".", help="the app folder (default: .)")
    p_key.add_argument("-c", "--run-config", action="append", default=[], help="key=value ... or a TOML file")
    p_key.add_argument("--out", type=Path, default=None, help="default: the client state folder (simulation)")
    p_key.add_argument("--seed", type=int, default=None, help="derive the key from a secret seed (default: random)")
    p_key.add_argument("--force", action="store_true", help="replace an existing key file")

    p_dec = sub.add_parser("decrypt", help="decrypt a saved encrypted global model with the clients' key")
    p_dec.add_argument("model", type=Path, help="model.safetensors or a checkpoint of an encrypted run")
    p_dec.add_argument("--key", type=Path, required=True, help="the clients' key file")
    p_dec.add_argument("--out", type=Path, required=True, help="where the decrypted model goes")

    audit_cli.add_parser(sub)
    audit_app.add_parser(sub)

    p_tap = sub.add_parser("tap", help="eavesdrop on a Flower deployment: a Fleet API proxy recording what it relays")
    p_tap.add_argument("--listen", required=True, help="HOST:PORT the SuperNodes dial (their --superlink)")
    p_tap.add_argument("--upstream", required=True, help="HOST:PORT of the SuperLink's Fleet API")
    p_tap.add_argument("--out", type=Path, required=True, help="where captures go (run-<id>/captures/...)")
    p_tap.add_argument("--spool-mb", type=float, default=2048.0, help="disk cap for objects awaiting their message")

    p_rob = sub.add_parser(
        "robustness-check", help="sanity checks of a finished run's robust accuracy (AutoAttack vs PGD, ε sweep, ...)"
    )
    p_rob.add_argument("run_dir", type=Path, help="the folder of a finished run (config.json, model.safetensors)")
    p_rob.add_argument("--samples", type=int, default=100, help="central test images (class-stratified; default 100)")
    p_rob.add_argument(
        "--square-queries", type=int, default=5000, help="Square's budget (AutoAttack's 5000; less is cheaper, weaker)"
    )

    deployment_cli.add_parser(sub)

    sub.add_parser("stop-superlink", help="stop the local SuperLink that flwr run left running ($FLWR_HOME)")

    p_exp = sub.add_parser("experiment", help="run a comparison from conf/experiments/*.toml; writes a table + plots")
    p_exp.add_argument("spec", help="experiment file, e.g. conf/experiments/masking-cpu.toml")
    p_exp.add_argument("--app", default=".", help="the app folder (default: .)")
    p_exp.add_argument("--out", default="outputs", help="results go to <out>/<experiment name>/")
    p_exp.add_argument("-c", "--run-config", action="append", default=[], help="key=value overrides for every run")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "run":
        return run(args)
    if args.command == "check-config":
        return check_config(Path(args.app), args.run_config)
    if args.command in ("keygen", "decrypt"):
        return keys(args)
    if args.command == "audit":
        return audit_cli.main(args)
    if args.command == "audit-app":
        return audit_app.main(args)
    if args.command == "tap":
        from fedvit.app.tap import main as serve_tap

        return serve_tap(args)
    if args.command == "deploy":
        return deployment_cli.main(args)
    if args.command == "robustness-check":
        return robustness_check(args)
    if args.command == "experiment":
        from fedvit.app.experiments import load_experiment, run_experiment

        run_experiment(load_experiment(Path(args.spec)), Path(args.app).resolve(), Path(args.out), args.run_config)
        return 0
    stopped = stop_local_superlink()
    print(f"stopped {stopped} process(es)")
    return 0


def robustness_check(args: argparse.Namespace) -> int:
    """Exit 0 when every check passes, 1 when one fails, 2 when the run cannot be read."""
    from fedvit.app.robustness_check import markdown, run_checks

    for flag, value in (("--samples", args.samples), ("--square-queries", args.square_queries)):
        if value < 1:
            print(f"fedvit robustness-check: {flag} must be >= 1, got {value}", file=sys.stderr)
            return 2
    try:
        report = run_checks(args.run_dir, args.samples, args.square_queries)
    except (FileNotFoundError, ConfigError) as err:
        print(f"fedvit robustness-check: {err}", file=sys.stderr)
        return 2
    print(markdown(report))
    print(f"written: {args.run_dir / 'robustness-check.md'} and .json")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
