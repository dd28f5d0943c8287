"""The Docker Compose deployment, run for real: README's commands on a real Docker engine.

Marked ``compose`` (not in the default suite; CI runs ``uv run --frozen --group compose pytest -m compose``).
Installs docker.io and mmdebstrap when missing, starts dockerd only when none answers (and stops only that one),
makes Flower's base images present (pulled, else local stand-ins: ``fedvit deploy base-images``), and works in a
copy of the app under its own compose project name, so a checkout's own ``outputs/`` and a running ``fedvit``
stack are never touched. Phase times are printed and written to ``benchmarks/results/compose-phases.json``.
The tests share one stack and run in file order; the last one takes it down.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from safetensors.numpy import load_file

from fedvit.app.deployment.compose import compose_layout
from fedvit.app.deployment.credentials import write_credentials
from fedvit.app.deployment.topology import SUPERLINK_PORT, processes
from tests.docker_engine import compose_env, docker_engine, install_missing

# xdist: one Docker stack at a time
pytestmark = [pytest.mark.compose, pytest.mark.xdist_group("docker")]
ROOT = Path(__file__).resolve().parents[1]
PROJECT = "fedvit-compose-test"
NODES = 5  # the compose file's SuperNodes
APP_UID = 49999  # the user Flower's images run as
# What `docker build` and `flwr build` need of the checkout (the FAB honours the copied .gitignore).
APP_FILES = [
    "pyproject.toml",
    "README.md",
    "LICENSE",
    ".gitignore",
    ".dockerignore",
    "docker-compose.yml",
    "docker-compose.gpu.yml",
]
APP_DIRS = ["src", "deploy"]
WRITABLE = ["outputs", "data", "deploy/state/superlink", "deploy/keys"]
CONTAINER_KEYS = {".auth", ".key"}  # superlink.key, supernode-i.{key,auth}; the CA's ca.key is left alone
PHASES_FILE = ROOT / "benchmarks" / "results" / "compose-phases.json"
REJECT_TIMEOUT_S = 120
RUN_TIMEOUT_S = 900


class Stack:
    """One compose project in a copy of the app; every command runs there, timed by phase."""

    def __init__(self, app: Path, env: dict[str, str]) -> None:
        self.app, self.env = app, env
        self.phases: dict[str, float] = {}

    def sh(self, *cmd: str, timeout: float = 1800, check: bool = True, **kw) -> subprocess.CompletedProcess:
        done = subprocess.run(
            list(cmd), cwd=self.app, env=self.env, capture_output=True, text=True, timeout=timeout, check=False, **kw
        )
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} -> {done.returncode}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
        return done

    def fedvit(self, *args: str, **kw) -> subprocess.CompletedProcess:
        return self.sh(sys.executable, "-m", "fedvit.app.cli", *args, **kw)

    def timed(self, phase: str, *cmd: str, **kw) -> subprocess.CompletedProcess:
        start = time.perf_counter()
        done = self.sh(*cmd, **kw)
        self.phases[phase] = round(time.perf_counter() - start, 1)
        return done

    def containers(self, *flags: str) -> list[str]:
        return self.sh("docker", "compose", "ps", "-a", "-q", *flags).stdout.split()

    def logs(self, service: str) -> str:
        return self.sh("docker", "compose", "logs", "--no-color", service, check=False).stdout


def copy_app(dest: Path) -> None:
    for name in APP_FILES:
        shutil.copy2(ROOT / name, dest / name)
    ignore = shutil.ignore_patterns("__pycache__", "credentials", "state", "keys")
    for name in APP_DIRS:
        shutil.copytree(ROOT / name, dest / name, ignore=ignore)


def port_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def record(phases: dict[str, float]) -> None:
    PHASES_FILE.parent.mkdir(parents=True, exist_ok=True)
    PHASES_FILE.write_text(json.dumps(phases, indent=1) + "\n")
    print("\ncompose phases (s): " + ", ".join(f"{k} {v}" for k, v in phases.items()))


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    phases: dict[str, float] = {}
    start = time.perf_counter()
    installed = install_missing()
    phases["install " + (" ".join(installed) or "(nothing missing)")] = round(time.perf_counter() - start, 1)
    work = tmp_path_factory.mktemp("compose")
    env = compose_env(work / "docker-config") | {
        "COMPOSE_PROJECT_NAME": PROJECT,
        "FLWR_HOME": str(work / "flwr-home"),
        "FLWR_TELEMETRY_ENABLED": "0",
        "FLWR_DISABLE_UPDATE_CHECK": "1",
    }
    # Outside pytest's 0700 temp root: a non-root user must be able to reach the results.
    app = Path(tempfile.mkdtemp(prefix="fedvit-compose-"))
    app.chmod(0o755)
    start = time.perf_counter()
    with docker_engine(work) as engine:
        phases[f"engine ({engine})"] = round(time.perf_counter() - start, 1)
        s = Stack(app, env)
        try:
            s.phases = phases
            assert port_free(SUPERLINK_PORT), f"port {SUPERLINK_PORT} is taken; the compose file publishes it"
            copy_app(app)
            # README "Deployment with Docker Compose", step by step.
            s.timed("base images", sys.executable, "-m", "fedvit.app.cli", "deploy", "base-images")
            s.fedvit("deploy", "credentials", "deploy/credentials", "--supernodes", str(NODES))
            for name in WRITABLE:
                (app / name).mkdir(parents=True, exist_ok=True)
            # The one root step (README): the containers run as Flower's user 49999 and compose bind-mounts these
            # folders and the (0600) private keys they read with the host's owners and modes; the CA key stays.
            keys = (app / "deploy/credentials").glob("*")
            private = [k.relative_to(app) for k in keys if k.suffix in CONTAINER_KEYS and k.name != "ca.key"]
            for top in [*WRITABLE, *private]:
                for path in [app / top, *(app / top).rglob("*")]:
                    os.chown(path, APP_UID, APP_UID)
            # an earlier run killed mid-way leaves this project's containers behind (same names): remove them first
            s.sh("docker", "compose", "down", "-v", "--remove-orphans", check=False, timeout=300)
            s.timed("build superexec image", "docker", "compose", "build")
            s.timed("up -d", "docker", "compose", "up", "-d")
            s.timed("register", sys.executable, "-m", "fedvit.app.cli", "deploy", "register",
                    "--connection", "fedvit-docker", "--address", f"127.0.0.1:{SUPERLINK_PORT}")  # fmt: skip
        except Exception:
            print(s.logs("superlink")[-3000:])  # why the stack did not come up
            raise
        else:
            yield s
        finally:
            down = time.perf_counter()
            s.sh("docker", "compose", "down", "-v", "--remove-orphans", check=False, timeout=300)
            phases.setdefault("down -v", round(time.perf_counter() - down, 1))
            record(phases)
            shutil.rmtree(app, ignore_errors=True)


def metrics(run_dir: Path) -> dict[int, dict]:
    return {e["round"]: e for e in json.loads((run_dir / "metrics.json").read_text())["rounds"]}


def readable_by_nobody(path: Path) -> bool:
    """Read the file as an unprivileged user (uid/gid 65534), not by looking at mode bits."""
    if os.geteuid() != 0:
        return os.access(path, os.R_OK)
    read = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "cat", str(path)]
    return subprocess.run(read, capture_output=True, check=False).returncode == 0


def test_two_rounds_finish_on_the_host_with_a_crashed_supernode(stack):
    """README step 5 with 2 rounds; SuperNode 5's process is SIGKILLed (a crash, as the OOM killer would) once
    round 1 is recorded: Docker's `restart: unless-stopped` brings the container back and the run completes."""
    run_dir = stack.app / "outputs" / "docker-1"
    cmd = [sys.executable, "-m", "fedvit.app.cli", "run", ".", "fedvit-docker",
           "-c", "run-name='docker-1' num-server-rounds=2 round-timeout=240.0"]  # fmt: skip
    start = time.perf_counter()
    run = subprocess.Popen(
        cmd, cwd=stack.app, env=stack.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    victim = "supernode-5"
    try:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while not ((run_dir / "metrics.json").exists() and 1 in metrics(run_dir)):
            assert run.poll() is None, run.stdout.read()[-6000:]
            assert time.monotonic() < deadline, "round 1 did not finish"
            time.sleep(0.5)
        stack.phases["round 1 (incl. containers' first task)"] = round(time.perf_counter() - start, 1)
        (cid,) = stack.containers(victim)
        pid = stack.sh("docker", "inspect", "-f", "{{.State.Pid}}", cid).stdout.strip()
        os.kill(int(pid), 9)
        output, _ = run.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        if run.poll() is None:
            run.kill()
    stack.phases["2 rounds"] = round(time.perf_counter() - start, 1)
    assert run.returncode == 0, output[-6000:]
    assert "finished:completed" in output
    rounds = metrics(run_dir)
    assert sorted(rounds) == [0, 1, 2]
    assert sorted(rounds[1]["sampled"]) == list(range(NODES)) and rounds[1]["rejected"] == {}
    second = rounds[2]
    # Every client sampled in round 2 either replied or is logged as rejected; the others were aggregated.
    assert second["num-examples"] > 0
    assert set(second["rejected"]) <= {str(p) for p in second["sampled"]}
    restarts = int(stack.sh("docker", "inspect", "-f", "{{.RestartCount}}", cid).stdout)
    print(f"\nround 2 after the crash: sampled {second['sampled']}, rejected {second['rejected']}, restarts {restarts}")
    assert restarts >= 1, "the restart policy did not bring the crashed SuperNode back"
    model = load_file(str(run_dir / "model.safetensors"))
    assert model and all(v.size for v in model.values())
    for path in (run_dir / "metrics.json", run_dir / "model.safetensors", run_dir / "config.json"):
        assert path.stat().st_uid == APP_UID  # written in the container
        assert readable_by_nobody(path), f"{path} is not readable by a non-root user"


def test_supernode_with_unregistered_key_is_rejected(stack, tmp_path):
    write_credentials(tmp_path, 1)  # a valid key pair the SuperLink never registered
    key = stack.app / "deploy" / "unregistered.auth"
    shutil.copyfile(tmp_path / "supernode-1.auth", key)
    os.chown(key, APP_UID, APP_UID)
    layout = compose_layout(NODES)
    argv = list(processes(layout)[2].argv[1:])  # supernode-1's flags ...
    argv[argv.index("--auth-supernode-private-key") + 1] = "/app/credentials/unregistered.auth"  # ... another key
    creds = stack.app / "deploy" / "credentials"
    mounts = [f"{creds}/{name}:/app/credentials/{name}:ro" for name in ("ca.crt", "supernode-1.crt", "supernode-1.key")]
    mounts.append(f"{key}:/app/credentials/unregistered.auth:ro")
    name = f"{PROJECT}-unregistered"
    cmd = ["docker", "run", "--rm", "--name", name, "--network", f"{PROJECT}_default"]
    cmd += [arg for m in mounts for arg in ("-v", m)]
    try:
        done = stack.sh(*cmd, "flwr/supernode:1.41.0", *argv, check=False, timeout=REJECT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the unregistered SuperNode was still running after {REJECT_TIMEOUT_S} s")
    finally:
        stack.sh("docker", "rm", "-f", name, check=False)
    assert done.returncode != 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Failed to activate SuperNode" in done.stdout + done.stderr


def test_gpu_override_renders(stack):
    done = stack.sh("docker", "compose", "-f", "docker-compose.yml", "-f", "docker-compose.gpu.yml", "config",
                    "--format", "json")  # fmt: skip
    services = json.loads(done.stdout)["services"]
    for i in range(1, NODES + 1):
        spec = services[f"superexec-clientapp-{i}"]
        (device,) = spec["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
        assert "cu" in spec["build"]["args"]["TORCH_INDEX"]


def test_down_removes_every_container_network_and_volume(stack):
    start = time.perf_counter()
    stack.sh("docker", "compose", "down", "-v", timeout=300)
    stack.phases["down -v"] = round(time.perf_counter() - start, 1)
    label = f"label=com.docker.compose.project={PROJECT}"
    for kind in (["ps", "-a"], ["network", "ls"], ["volume", "ls"]):
        left = stack.sh("docker", *kind, "-q", "--filter", label).stdout.split()
        assert left == [], (kind, left)
