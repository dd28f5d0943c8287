"""``fedvit deploy credentials | register | compose | bundle | check-bundles | base-images | loopback``."""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEFAULT_CREDENTIALS = Path("deploy/credentials")
SUPERLINK_UNAVAILABLE = "Connection to the SuperLink is unavailable"  # flwr 1.41's message while none answers


def add_parser(sub) -> None:
    p = sub.add_parser("deploy", help="deployment: credentials, key registration, compose file, loopback run")
    deploy = p.add_subparsers(dest="deploy_command", required=True)

    cred = deploy.add_parser("credentials", help="write the CA, server certificates and SuperNode auth keys")
    cred.add_argument(
        "out", nargs="?", type=Path, default=DEFAULT_CREDENTIALS, help=f"where they go (default: {DEFAULT_CREDENTIALS})"
    )
    cred.add_argument("--supernodes", type=int, default=5, help="SuperNodes to make keys for (default 5)")
    cred.add_argument(
        "--superlink-name", action="append", default=[], help="extra DNS name or IP SuperNodes dial (repeatable)"
    )
    cred.add_argument("--force", action="store_true", help="replace existing credentials")

    reg = deploy.add_parser("register", help="add the flwr connection and register every SuperNode's public key")
    reg.add_argument("--connection", default="fedvit-docker", help="connection name in $FLWR_HOME/config.toml")
    reg.add_argument("--address", default="127.0.0.1:8000", help="SuperLink address as the CLI dials it")
    reg.add_argument(
        "--credentials", type=Path, default=DEFAULT_CREDENTIALS, help="folder with ca.crt and the public keys"
    )
    reg.add_argument("--supernodes", type=int, default=5, help="SuperNode keys to register (default 5)")
    reg.add_argument(
        "--wait", type=float, default=120.0, help="seconds to wait for a SuperLink that is still starting (default 120)"
    )

    comp = deploy.add_parser("compose", help="(re)write docker-compose.yml and docker-compose.gpu.yml")
    comp.add_argument("--supernodes", type=int, default=5, help="SuperNode services (default 5)")
    comp.add_argument("--superlink-address", default=None, help="host:port SuperNodes dial (remote machines)")
    comp.add_argument("--out", type=Path, default=Path("."), help="folder the compose files go to (default: .)")

    bundle = deploy.add_parser(
        "bundle", help="one folder per host (server, client-1..N), each with only its own credentials"
    )
    bundle.add_argument("out", type=Path, help="where the host folders go (server/, client-1/, ...)")
    bundle.add_argument("--superlink-address", required=True, help="host:port the client hosts dial")
    bundle.add_argument("--supernodes", type=int, default=5, help="client hosts (default 5)")
    bundle.add_argument("--credentials", type=Path, default=DEFAULT_CREDENTIALS, help="from `deploy credentials`")
    bundle.add_argument(
        "--encryption-key", type=Path, default=None, help="clients' key (`fedvit keygen`), clients only"
    )
    bundle.add_argument(
        "--source", type=Path, default=None, help="fedvit checkout path on the hosts (default: this one), for the build"
    )
    bundle.add_argument("--force", action="store_true", help="replace existing bundles")

    check = deploy.add_parser("check-bundles", help="fail if any bundle holds private material not its own")
    check.add_argument("out", type=Path, help="the folder `deploy bundle` wrote")

    images = deploy.add_parser(
        "base-images",
        help="make Flower's base images present: pull them, or build local stand-ins where Docker Hub is out of reach",
    )
    images.add_argument("--app", type=Path, default=Path("."), help="the fedvit checkout (Dockerfiles)")
    images.add_argument("--no-pull", action="store_true", help="do not try Docker Hub; build stand-ins at once")

    loop = deploy.add_parser("loopback", help="run the deployment topology as local processes (TLS + auth on)")
    loop.add_argument("app", nargs="?", default=".", help="the app folder (default: .)")
    loop.add_argument("--supernodes", type=int, default=3, help="SuperNode processes (default 3)")
    loop.add_argument("--workdir", type=Path, default=None, help="credentials, logs, state (default: a temp dir)")
    loop.add_argument("-c", "--run-config", action="append", default=[], help="key=value overrides")


def main(args: argparse.Namespace) -> int:
    from fedvit.app.deployment.credentials import CredentialsError, write_credentials

    try:
        if args.deploy_command == "credentials":
            files = write_credentials(args.out, args.supernodes, args.superlink_name, force=args.force)
            print(f"wrote {len(files)} files to {args.out} (private keys 0600)")
            return 0
        if args.deploy_command == "register":
            return register(args)
        if args.deploy_command in ("bundle", "check-bundles"):
            return bundles(args)
    except (CredentialsError, ValueError) as err:
        print(f"fedvit deploy: {err}", file=sys.stderr)
        return 2
    if args.deploy_command == "base-images":
        from fedvit.app.deployment.images import ImageError, ensure_base_images

        try:
            ensure_base_images(args.app, pull=not args.no_pull)
        except ImageError as err:
            print(f"fedvit deploy base-images: {err}", file=sys.stderr)
            return 1
        return 0
    if args.deploy_command == "compose":
        from fedvit.app.deployment.compose import write_compose

        for path in write_compose(args.out, args.supernodes, args.superlink_address):
            print(f"wrote {path}")
        return 0
    return loopback(args)


def bundles(args: argparse.Namespace) -> int:
    from fedvit.app.deployment.bundle import BundleError, check_bundles, write_bundles

    try:
        if args.deploy_command == "bundle":
            folders = write_bundles(
                args.out, args.credentials, args.supernodes, args.superlink_address,
                args.encryption_key, args.source, args.force,
            )  # fmt: skip
            for folder in folders:
                print(f"wrote {folder}/ (commands: {folder / 'README.md'})")
            print("checked: no bundle holds another host's private key or secret; the CA key stays where it is")
            return 0
    except BundleError as err:
        print(f"fedvit deploy bundle: {err}", file=sys.stderr)
        return 2
    problems = check_bundles(args.out)
    for problem in problems:
        print(f"fedvit deploy check-bundles: {problem}", file=sys.stderr)
    if not problems:
        print(f"{args.out}: every private key and secret is in its owner's bundle only")
    return 1 if problems else 0


def register(args: argparse.Namespace) -> int:
    from fedvit.app.deployment.connection import add_connection
    from fedvit.app.deployment.credentials import register_command
    from fedvit.app.flower_processes import flower_env, flwr_executable, flwr_home

    flwr = flwr_executable()
    commands = [register_command(flwr, args.credentials, i, args.connection) for i in range(args.supernodes)]
    config = add_connection(flwr_home(), args.connection, args.address, args.credentials / "ca.crt")
    print(f"connection [superlink.{args.connection}] in {config}")
    deadline = time.monotonic() + args.wait
    for cmd in commands:  # every key file was found before anything was written
        while True:
            done = subprocess.run(cmd, env=flower_env(), capture_output=True, text=True, check=False)
            starting = done.returncode != 0 and SUPERLINK_UNAVAILABLE in done.stderr
            if not starting or time.monotonic() > deadline:
                break
            # `docker compose up -d` returns before the SuperLink listens (Docker's port proxy accepts at once).
            print(f"waiting for the SuperLink at {args.address} ...", flush=True)
            time.sleep(2.0)
        print("\n".join(part for part in (done.stdout.strip(), done.stderr.strip()) if part))
        if done.returncode != 0:
            return done.returncode
    return 0


def loopback(args: argparse.Namespace) -> int:
    from fedvit.app.deployment.loopback import DeploymentError, LoopbackDeployment
    from fedvit.app.run_config import check_config

    if check_config(Path(args.app), args.run_config):  # before starting a dozen processes
        return 2

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="fedvit-loopback-"))
    print(f"fedvit deploy loopback: {args.supernodes} SuperNodes; credentials, logs and state in {workdir}")
    started = time.perf_counter()
    try:
        with LoopbackDeployment(workdir, args.supernodes) as deployment:
            print(f"started in {time.perf_counter() - started:.1f} s; running the app", flush=True)
            done = deployment.run(Path(args.app).resolve(), args.run_config, stream=True)
    except (DeploymentError, FileNotFoundError) as err:
        print(f"fedvit deploy loopback: {err}", file=sys.stderr)
        return 1
    print(f"fedvit deploy loopback: exit {done.returncode} after {time.perf_counter() - started:.1f} s")
    return done.returncode
