"""Flower's processes as fedvit starts them: the ``flwr`` executables of this environment, ``FLWR_HOME``, the
environment every flwr call gets, free local ports, and finding/stopping the local SuperLink ``flwr run`` leaves."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import tomllib
from pathlib import Path

# Safe defaults for every flwr call made through this CLI (a user's explicit setting wins):
# without the first, the local SuperLink re-installs torch into a fresh env for every run.
FLOWER_ENV = {
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
}


def flower_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for flwr commands: ``base`` (default: os.environ) plus :data:`FLOWER_ENV` defaults."""
    env = dict(os.environ if base is None else base)
    for key, value in FLOWER_ENV.items():
        env.setdefault(key, value)
    # flwr starts `flower-superlink` by name: find this environment's even when it is not activated.
    here = str(Path(sys.executable).parent)
    if here not in env.get("PATH", "").split(os.pathsep):
        env["PATH"] = os.pathsep.join(filter(None, [here, env.get("PATH", "")]))
    return env


def private_superlink_env(home: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for a local SuperLink of one's own (tests, benchmarks): ``home`` as FLWR_HOME and two free
    ports, so it never meets another session's SuperLink."""
    http, control = free_ports(2)
    return dict(
        os.environ if base is None else base,
        FLWR_HOME=str(home),
        FLWR_LOCAL_SUPERLINK_HTTP_API_PORT=str(http),
        FLWR_LOCAL_CONTROL_API_PORT=str(control),
    )


SUPERLINK_START_WAIT = 180.0  # seconds; flwr run's own wait is 15 s, too short on a loaded 2-core machine

# Flower's own start of the local SuperLink (the command `flwr run` would launch), with a longer wait: flwr finds it
# healthy at the same ports and uses it. On a busy machine importing `flower-superlink` alone took over 15 s, and
# `flwr run` failed with "Failed to start local SuperLink within 15s" (seen in CI while docker images were built).
_START = """
import sys
import flwr.cli.local_superlink as local
local.LOCAL_SUPERLINK_STARTUP_TIMEOUT = float(sys.argv[1])
try:
    if not local._is_local_superlink_started():
        local._start_local_superlink(in_memory=sys.argv[2] == "in-memory")
except Exception as error:  # Flower's own message (a click exception), in one line
    sys.exit(str(error))
"""


def start_local_superlink(env: dict[str, str], python: str | Path | None = None, in_memory: bool = False,
                          wait: float = SUPERLINK_START_WAIT) -> None:  # fmt: skip
    """Start the local SuperLink that ``flwr run`` starts for a ``:local:`` connection (``in_memory``: for
    ``:local-in-memory:``) at ``env``'s FLWR_HOME and ports, unless one answers there, waiting up to ``wait``
    seconds for it; ``python``: the interpreter of the environment whose Flower runs it (default: this one).
    Raises RuntimeError with Flower's message where it does not start."""
    mode = "in-memory" if in_memory else "database"
    # stdout passes through: Flower's "Starting local SuperLink" line shows where flwr run's would have
    done = subprocess.run([str(python or sys.executable), "-c", _START, str(wait), mode], env=env,
                          stderr=subprocess.PIPE, text=True, check=False)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"the local SuperLink did not start: {done.stderr.strip().splitlines()[-1][-2000:]}")


def local_address(home: Path, name: str | None = None) -> str | None:
    """``:local:`` or ``:local-in-memory:`` where ``flwr run`` with connection ``name`` (default: the config's
    default) runs on a local SuperLink it starts itself, per ``home``'s config.toml (no config: flwr writes its
    default, whose connection is ``:local:``); None for any other connection."""
    config = home / "config.toml"
    if not config.is_file():
        return ":local:"
    links = tomllib.loads(config.read_text()).get("superlink", {})
    entry = links.get(name or links.get("default", ""), {})
    address = str(entry.get("address", "")) if isinstance(entry, dict) else ""
    return address if address in (":local:", ":local-in-memory:") else None


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports that are free on 127.0.0.1 right now."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def executable(name: str) -> str:
    """A console script of this environment (flwr, flower-superlink, ...)."""
    path = Path(sys.executable).parent / name
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: run inside the project environment (uv run --frozen ...)")
    return str(path)


def flwr_executable() -> str:
    """The ``flwr`` command of this environment (works without activating the venv), else the one on PATH."""
    beside = Path(sys.executable).parent / "flwr"
    found = str(beside) if beside.is_file() else shutil.which("flwr")
    if found is None:
        raise SystemExit("fedvit: no `flwr` command found; run through `uv run --frozen fedvit ...`")
    return found


def flwr_home() -> Path:
    """``$FLWR_HOME``, else ``~/.flwr`` (where Flower keeps its config and the local SuperLink's state)."""
    return Path(os.environ.get("FLWR_HOME", Path.home() / ".flwr"))


def superlink_pids(flwr_home: Path, with_env: str | None = None, or_flag: str | None = None) -> list[int]:
    """PIDs of local SuperLink/SuperExec processes started with this FLWR_HOME (Linux /proc).

    With ``with_env`` (``NAME=value``), only SuperLinks whose environment lacks that setting (and whose command
    line lacks ``or_flag``, a flag that has the same effect).
    """
    pids = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if "flower-superlink" not in cmdline and "flower-superexec" not in cmdline:
            continue
        home = next((e[len(b"FLWR_HOME=") :].decode() for e in environ if e.startswith(b"FLWR_HOME=")), "")
        if Path(home or Path.home() / ".flwr").resolve() != flwr_home.resolve():
            continue
        if with_env is not None:
            explicit = or_flag is not None and or_flag in cmdline
            if "flower-superlink" not in cmdline or explicit or with_env.encode() in environ:
                continue
        pids.append(int(proc.name))
    return pids


def stop_local_superlink(home: Path | None = None, timeout: float = 10.0) -> int:
    """Stop the detached local SuperLink (and its SuperExec) that ``flwr run`` left running for ``home``."""
    pids = superlink_pids(home or flwr_home())
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in pids):
        time.sleep(0.2)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return len(pids)


def relay(cmd: list[str], env: dict[str, str], printed: list[str]) -> int:
    """Run ``cmd``, printing its output line by line as it comes and keeping each line in ``printed``."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        sys.stdout.write(line)
        sys.stdout.flush()
        printed.append(line.rstrip("\n"))
    return proc.wait()


def run_status(run_id: str, superlink: str | None, env: dict[str, str]) -> str:
    """Final status of a run as Flower reports it, e.g. ``finished:completed`` or ``finished:failed``."""
    cmd = [flwr_executable(), "ls", *([superlink] if superlink else []), "--run-id", run_id, "--format", "json"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False).stdout
    try:
        return json.loads(out)["runs"][0]["status"]
    except (ValueError, KeyError, IndexError):
        return f"unknown ({out.strip()[:200]})"
