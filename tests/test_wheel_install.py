"""fedvit installed as a user installs it: the built wheel in a fresh virtual environment beside a user's own
top-level ``core`` package and ``strategies.py`` module, a Flower app that imports all three and records its clients
with ``from fedvit import capture_mod``, a real ``flwr run`` simulation, then ``fedvit audit`` of the capture.

The environment takes the Flower release of the interpreter running the test (CI runs it on 1.41 and on 1.42).
Marked ``deployment``: a wheel build, an environment and a simulation (~1-2 min).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from importlib.metadata import version
from pathlib import Path

import numpy as np
import pytest

from fedvit.app.flower_processes import private_superlink_env, start_local_superlink, superlink_pids

pytestmark = [pytest.mark.deployment, pytest.mark.long]
ROOT = Path(__file__).resolve().parents[1]
THIRDPARTY = Path(__file__).parent / "thirdparty_app"
FLOWER_GROUPS = {"1.41": "flwr-1-41", "1.42": "flwr-1-42"}  # pyproject's dependency groups, one per release


def run(*cmd: str | Path, timeout: float = 900, **kw) -> subprocess.CompletedProcess:
    done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, check=False, **kw)
    assert done.returncode == 0, f"{cmd} -> {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def user_library(folder: Path) -> Path:
    """A distribution of the user's own with a top-level ``core`` package and a top-level ``strategies.py``."""
    (folder / "core").mkdir(parents=True)
    (folder / "core" / "__init__.py").write_text('ORIGIN = "the user\'s core"\n')
    (folder / "strategies.py").write_text(textwrap.dedent('''\
        """The user's strategies module."""
        from flwr.serverapp.strategy import FedAvg

        ORIGIN = "the user's strategies"


        def fedavg(**kwargs):
            return FedAvg(**kwargs)
        '''))
    (folder / "pyproject.toml").write_text(textwrap.dedent("""\
        [build-system]
        requires = ["hatchling"]
        build-backend = "hatchling.build"

        [project]
        name = "userlib"
        version = "1.0"

        [tool.hatch.build.targets.wheel]
        include = ["core", "strategies.py"]
        """))
    return folder


def user_app(folder: Path) -> Path:
    """The third-party CNN app, changed as a user would: the capture from ``fedvit``'s public API, the strategy from
    their own ``strategies``, and a check in both apps that ``core`` and ``strategies`` are the user's."""
    shutil.copytree(THIRDPARTY, folder, ignore=shutil.ignore_patterns("__pycache__"))
    check = (
        "import core, strategies\n"
        "if core.ORIGIN != \"the user's core\" or strategies.ORIGIN != \"the user's strategies\":\n"
        "    raise RuntimeError(f'shadowed: {core.__file__} {strategies.__file__}')\n"
    )
    client = folder / "cnnapp" / "client_app.py"
    text = client.read_text().replace("app = ClientApp()", "app = ClientApp(mods=[capture_mod])")
    client.write_text("from fedvit import capture_mod\n" + check + text)
    server = folder / "cnnapp" / "server_app.py"
    text = server.read_text().replace("strategy = FedAvg(", "strategy = strategies.fedavg(")
    server.write_text(check + text)
    pyproject = folder / "pyproject.toml"  # Flower refuses overrides of keys the app does not declare
    pyproject.write_text(pyproject.read_text().replace('final-model = ""', 'final-model = ""\nfedvit-capture-dir = ""'))
    assert "strategies.fedavg(" in server.read_text() and "mods=[capture_mod]" in client.read_text()
    return folder


def fresh_environment(tmp: Path, wheel: Path, userlib: Path) -> Path:
    """A new virtual environment with fedvit's wheel (its dependencies pinned as uv.lock pins them for this Flower
    release) and the user's library; returns its bin folder."""
    release = ".".join(version("flwr").split(".")[:2])
    groups = ["--group", FLOWER_GROUPS[release]] + (["--no-group", "flwr-1-41"] if release != "1.41" else [])
    pins = tmp / "requirements.txt"
    run("uv", "export", "--project", ROOT, "--frozen", "--no-dev", "--no-emit-project", "--no-hashes", *groups,
        "-o", pins)  # fmt: skip
    venv = tmp / "venv"
    run("uv", "venv", "--quiet", "--python", sys.executable, venv)
    # hardlinks from uv's cache, which the project's own `uv sync` filled: seconds, not a second 6 GB copy
    run("uv", "pip", "install", "--quiet", "--python", venv / "bin" / "python", "--link-mode=hardlink", "-r", pins,
        wheel, userlib)  # fmt: skip
    return venv / "bin"


def test_the_wheel_installs_beside_a_users_core_and_strategies_and_captures_and_audits_their_app(tmp_path):
    dist = tmp_path / "dist"
    run("uv", "build", "--wheel", "--out-dir", dist, ROOT)
    wheel = next(dist.glob("fedvit-*.whl"))
    listing = run(sys.executable, "-m", "zipfile", "-l", wheel).stdout.splitlines()[1:]
    tops = {line.split()[0].split("/")[0] for line in listing if line.strip()}
    assert tops == {"fedvit", wheel.name.split("-py3")[0] + ".dist-info"}, tops  # nothing outside the namespace

    bin_dir = fresh_environment(tmp_path, wheel, user_library(tmp_path / "userlib"))
    # As on a user's machine, the environment's processes write bytecode: CI sets PYTHONDONTWRITEBYTECODE, and the
    # fresh environment has no .pyc, so every process (Ray's workers, the audit) compiled torch's sources again.
    user_env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    where = run(bin_dir / "python", "-c", "import core, strategies, fedvit, flwr.common; "
                "print(core.__file__, strategies.__file__, fedvit.__file__, fedvit.__version__, sep='\\n')",
                cwd=tmp_path, env=user_env).stdout.split()  # fmt: skip
    assert all("/venv/" in path for path in where[:3]) and "userlib" not in where[2], where
    version_line = run(bin_dir / "fedvit", "--version", env=user_env).stdout
    assert version_line.startswith(f"fedvit {where[3]} (Flower {version('flwr')})")

    app = user_app(tmp_path / "app")
    captures, home = tmp_path / "captures", tmp_path / "flwr-home"
    env = private_superlink_env(home, user_env) | {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
        "FLWR_TELEMETRY_ENABLED": "0",
        "PYTHONPATH": "",
    }
    try:
        start_local_superlink(env, python=bin_dir / "python")  # with a longer wait than flwr run's 15 s
        done = subprocess.run(
            [bin_dir / "flwr", "run", app, "--stream", "--federation-config",
             "num-supernodes=2 client-resources-num-cpus=1", "-c", f"fedvit-capture-dir='{captures}'"],
            env=env, cwd=app, capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
    finally:
        for pid in superlink_pids(home):
            subprocess.run(["kill", str(pid)], check=False)
    log = done.stdout + done.stderr
    assert done.returncode == 0 and "Strategy execution finished" in log, log[-4000:]
    assert "shadowed" not in log

    train = [m for m in captures.glob("run-*/captures/round-*/node-*.json") if m.stem.split("-")[-1].isdigit()]
    assert len(train) == 4  # 2 rounds x 2 clients
    out = tmp_path / "audit"
    run(bin_dir / "fedvit", "audit", captures, "--out", out, "--model", "cnnapp.task:Net", "--app-dir", THIRDPARTY,
        "--data", "cnnapp_partitions:partition", "--decoy-partitions", "4-40", "--iterations", "20", "--restarts", "1",
        env=env | {"PYTHONPATH": str(THIRDPARTY)})  # fmt: skip
    report = json.loads((out / "audit.json").read_text())
    assert len(report["updates"]) == 4
    sys.path.insert(0, str(THIRDPARTY))
    try:
        from cnnapp_partitions import partition
    finally:
        sys.path.remove(str(THIRDPARTY))
    for row in report["updates"]:
        labels = partition(row["partition"])[1]
        expected = {str(c): int(n) for c, n in zip(*np.unique(labels, return_counts=True), strict=True)}
        assert row["labels"] == expected, row
    assert "4 of 4 exactly right" in report["verdict-detail"]
