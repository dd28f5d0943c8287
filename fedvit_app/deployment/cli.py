"""``fedvit deploy credentials | register | compose | loopback``."""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEFAULT_CREDENTIALS = Path("deploy/credentials")


def add_parser(sub) -> None:
    p = sub.add_parser("deploy", help="deployment: credentials, key registration, compose file, loopback run")
    deploy = p.add_subparsers(dest="deploy_command", required=True)

    cred = deploy.add_parser("credentials", help="write the CA, server certificates and SuperNode auth keys")
    cred.add_argument("out", nargs="?", type=Path, default=DEFAULT_CREDENTIALS)
    cred.add_argument("--supernodes", type=int, default=5)
    cred.add_argument(
        "--superlink-name", action="append", default=[], help="extra DNS name or IP SuperNodes dial (repeatable)"
    )
    cred.add_argument("--force", action="store_true", help="replace existing credentials")

    reg = deploy.add_parser("register", help="add the flwr connection and register every SuperNode's public key")
    reg.add_argument("--connection", default="fedvit-docker", help="connection name in $FLWR_HOME/config.toml")
    reg.add_argument("--address", default="127.0.0.1:8000", help="SuperLink address as the CLI dials it")
    reg.add_argument("--credentials", type=Path, default=DEFAULT_CREDENTIALS)
    reg.add_argument("--supernodes", type=int, default=5)

    comp = deploy.add_parser("compose", help="(re)write docker-compose.yml and docker-compose.gpu.yml")
    comp.add_argument("--supernodes", type=int, default=5)
    comp.add_argument("--superlink-address", default=None, help="host:port SuperNodes dial (remote machines)")
    comp.add_argument("--out", type=Path, default=Path("."))

    loop = deploy.add_parser("loopback", help="run the deployment topology as local processes (TLS + auth on)")
    loop.add_argument("app", nargs="?", default=".")
    loop.add_argument("--supernodes", type=int, default=3)
    loop.add_argument("--workdir", type=Path, default=None, help="credentials, logs, state (default: a temp dir)")
    loop.add_argument("-c", "--run-config", action="append", default=[], help="key=value overrides")


def main(args: argparse.Namespace) -> int:
    from fedvit_app.deployment.credentials import CredentialsError, write_credentials

    try:
        if args.deploy_command == "credentials":
            files = write_credentials(args.out, args.supernodes, args.superlink_name, force=args.force)
            print(f"wrote {len(files)} files to {args.out} (private keys 0600)")
            return 0
        if args.deploy_command == "register":
            return register(args)
    except (CredentialsError, ValueError) as err:
        print(f"fedvit deploy: {err}", file=sys.stderr)
        return 2
    if args.deploy_command == "compose":
        from fedvit_app.deployment.compose import write_compose

        for path in write_compose(args.out, args.supernodes, args.superlink_address):
            print(f"wrote {path}")
        return 0
    return loopback(args)


def register(args: argparse.Namespace) -> int:
    from fedvit_app.deployment.connection import add_connection
    from fedvit_app.deployment.credentials import register_command
    from fedvit_app.flower_processes import flower_env, flwr_executable, flwr_home

    flwr = flwr_executable()
    commands = [register_command(flwr, args.credentials, i, args.connection) for i in range(args.supernodes)]
    config = add_connection(flwr_home(), args.connection, args.address, args.credentials / "ca.crt")
    print(f"connection [superlink.{args.connection}] in {config}")
    for cmd in commands:  # every key file was found before anything was written
        done = subprocess.run(cmd, env=flower_env(), capture_output=True, text=True, check=False)
        print(done.stdout.strip() or done.stderr.strip())
        if done.returncode != 0:
            return done.returncode
    return 0


def loopback(args: argparse.Namespace) -> int:
    from fedvit_app.deployment.loopback import DeploymentError, LoopbackDeployment
    from fedvit_app.run_config import check_config

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
