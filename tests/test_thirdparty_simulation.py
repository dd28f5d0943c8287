"""The capture paths without the network, on the third-party app in a real ``flwr run`` simulation: the user's
one-line change (``ClientApp(mods=[capture_mod])``) and the server-side wrapper (``CapturingStrategy(FedAvg(...))``)
both record in one layout, and ``fedvit audit --model`` recovers every client's labels (B = 1, 2, 3, 4).

Marked ``deployment`` (run by CI beside the loopback tests) to keep the default suite within its time budget.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fedvit.app.flower_processes import (
    executable,
    flower_env,
    private_superlink_env,
    start_local_superlink,
    stop_local_superlink,
)

# xdist: a running Ray cluster is joined by any local ray.init()
pytestmark = [pytest.mark.deployment, pytest.mark.xdist_group("ray"), pytest.mark.long]
APP = Path(__file__).parent / "thirdparty_app"
sys.path.insert(0, str(APP))


def with_capture(app: Path) -> None:
    """The edits the audit docs ask of a user: the mod on the ClientApp, the wrapper around the strategy."""
    client = app / "cnnapp" / "client_app.py"
    text = client.read_text().replace("app = ClientApp()", "app = ClientApp(mods=[capture_mod])")
    client.write_text("from fedvit.capture.writer import capture_mod\n" + text)
    server = app / "cnnapp" / "server_app.py"
    text = server.read_text().replace(
        "strategy = FedAvg(",
        "strategy = CapturingStrategy(out_dir=config['fedvit-capture-dir'], run_config=dict(config), strategy=FedAvg(",
    )
    text = text.replace("min_available_nodes=2)", "min_available_nodes=2))")
    server.write_text("from fedvit.capture.writer import CapturingStrategy\n" + text)
    pyproject = app / "pyproject.toml"  # Flower refuses overrides of keys the app does not declare
    pyproject.write_text(pyproject.read_text().replace('final-model = ""', 'final-model = ""\nfedvit-capture-dir = ""'))
    assert "ClientApp(mods=[capture_mod])" in client.read_text() and "CapturingStrategy(" in server.read_text()


def test_capture_mod_and_server_wrapper_record_a_simulation_that_the_audit_reads(tmp_path):
    app = tmp_path / "app"
    shutil.copytree(APP, app, ignore=shutil.ignore_patterns("__pycache__"))
    with_capture(app)
    captures = tmp_path / "captures"
    home = tmp_path / "flwr-home"
    env = flower_env(private_superlink_env(home)) | {"FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1"}
    argv = [executable("flwr"), "run", str(app), "--stream", "--federation-config",
            "num-supernodes=4 client-resources-num-cpus=1", "-c", f"fedvit-capture-dir='{captures}'"]  # fmt: skip
    try:
        start_local_superlink(env)
        done = subprocess.run(argv, env=env, cwd=app, capture_output=True, text=True, timeout=600)
    finally:
        stop_local_superlink(home)
    print(done.stdout[-3000:], done.stderr[-2000:])
    assert done.returncode == 0 and "Strategy execution finished" in done.stdout + done.stderr

    client_view = sorted(captures.glob("run-*/captures/round-*/node-*.json"))
    server_view = sorted(captures.glob("run-*/captures/server/round-*/node-*.json"))
    train = [m for m in client_view if m.stem.split("-")[-1].isdigit()]
    assert len(train) == 8 and len([m for m in server_view if m.stem.split("-")[-1].isdigit()]) == 8

    from cnnapp_partitions import partition as load

    for view, extra in (("client", []), ("server", [])):
        root = captures if view == "client" else next(captures.glob("run-*/captures/server"))
        out = tmp_path / f"audit-{view}"
        partitions = extra
        if view == "server":  # the server view has no node config: the user maps nodes to partitions
            for manifest in train:
                head = json.loads(manifest.read_text())
                partitions.append(f"--partition={head['node']}={head['partition']}")
        audit = subprocess.run(
            [sys.executable, "-m", "fedvit.app.cli", "audit", str(root), "--out", str(out), "--model",
             "cnnapp.task:Net", "--app-dir", str(APP), "--data", "cnnapp_partitions:partition", *partitions,
             "--decoy-partitions", "4-40", "--iterations", "20", "--restarts", "1"],
            capture_output=True, text=True, timeout=600, env=flower_env(),
        )  # fmt: skip
        assert audit.returncode == 0, audit.stdout[-2000:] + audit.stderr[-2000:]
        report = json.loads((out / "audit.json").read_text())
        assert len(report["updates"]) == 8
        for row in report["updates"]:
            labels = load(row["partition"])[1]
            expected = {str(c): int(n) for c, n in zip(*np.unique(labels, return_counts=True), strict=True)}
            assert row["labels"] == expected and row["batch"] == row["partition"] + 1, row
        assert "8 of 8 exactly right" in report["verdict-detail"]
