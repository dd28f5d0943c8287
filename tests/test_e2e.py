"""Real ``flwr run`` simulations (3 SuperNodes, synthetic data) through the ``fedvit run`` CLI.

Each test run uses its own FLWR_HOME and free ports and stops the local SuperLink it started.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.numpy import load_file

from fedvit_app.cli import stop_local_superlink

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).parents[1]
FEDERATION = "num-supernodes=3 client-resources-num-cpus=1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def flower(tmp_path_factory):
    home = tmp_path_factory.mktemp("flwr-home")
    env = dict(
        os.environ,
        FLWR_HOME=str(home),
        FLWR_LOCAL_SUPERLINK_HTTP_API_PORT=str(free_port()),
        FLWR_LOCAL_CONTROL_API_PORT=str(free_port()),
    )
    out = tmp_path_factory.mktemp("outputs")

    def run(*overrides: str) -> subprocess.CompletedProcess:
        cmd = [
            sys.executable,
            "-m",
            "fedvit_app.cli",
            "run",
            str(ROOT),
            "--federation-config",
            FEDERATION,
            "-c",
            f"out-dir='{out}' num-server-rounds=3 fraction-train=0.67",
        ]
        for override in overrides:
            cmd += ["-c", override]
        proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
        print(proc.stdout[-4000:])
        return proc

    yield run, out
    stop_local_superlink(home)
    assert not stop_local_superlink(home), "SuperLink still running after teardown"


def model(path: Path) -> dict:
    return load_file(str(path))


def assert_identical(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert (a[k] == b[k]).all(), f"{k} differs"


def test_training_reproducibility_and_resume(flower):
    run, out = flower
    full = run("run-name='full'")
    assert full.returncode == 0, full.stdout[-2000:]
    rounds = json.loads((out / "full" / "metrics.json").read_text())["rounds"]
    assert [r["round"] for r in rounds] == [0, 1, 2, 3]
    assert rounds[-1]["central-accuracy"] > rounds[0]["central-accuracy"]
    assert all(r["bytes-up"] > 0 and len(r["sampled"]) == 2 for r in rounds[1:])
    for name in (
        "config.json",
        "model.safetensors",
        "plots/accuracy.png",
        "plots/loss.png",
        "checkpoints/round-0003.safetensors",
        "checkpoints/round-0002.safetensors",
    ):
        assert (out / "full" / name).is_file(), name
    assert "round 3/3 | loss" in full.stdout

    # A second, independent run with the same seed stops after round 2 ...
    first = run("run-name='part'", "num-server-rounds=2")
    assert first.returncode == 0, first.stdout[-2000:]
    assert_identical(
        model(out / "part" / "model.safetensors"),
        {k: v for k, v in model(out / "full" / "checkpoints" / "round-0002.safetensors").items()},
    )
    # ... and resumes from its checkpoint to round 3: bit-identical to the uninterrupted run.
    resumed = run(f"resume-from='{out / 'part'}'")
    assert resumed.returncode == 0, resumed.stdout[-2000:]
    assert_identical(model(out / "part" / "model.safetensors"), model(out / "full" / "model.safetensors"))
    resumed_rounds = json.loads((out / "part" / "metrics.json").read_text())["rounds"]
    assert [r["round"] for r in resumed_rounds] == [0, 1, 2, 3]


def test_client_side_config_error_stops_before_training(flower):
    run, out = flower
    bad = run("run-name='bad'", "data.synthetic-train-size=2")
    assert bad.returncode == 1
    assert "num-partitions=3 is invalid; allowed: at most the number of training samples (2)" in bad.stdout
    assert "finished:failed" in bad.stdout
    assert not (out / "bad").exists()  # nothing trained, nothing written


def test_cli_refuses_bad_value_before_starting_flower(flower):
    run, _ = flower
    bad = run("lr=-1")
    assert bad.returncode == 2
    assert "lr=-1.0 is invalid" in bad.stderr and "flwr run" not in bad.stdout
