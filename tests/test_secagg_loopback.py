"""fedvit's own SecAgg+ run over a loopback deployment (TLS, authenticated SuperNodes): five SuperNodes, two
rounds, and one SuperNode killed in round 1 after it has shared its keys. The round completes with the other four
(the reconstruction threshold is 3), its model is FedAvg over exactly those four within the stated quantisation
bound, and round 2 runs on the survivors."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from fedvit.app.deployment.loopback import LoopbackDeployment
from fedvit.app.deployment.topology import supernode_name
from fedvit.app.flower_processes import executable
from fedvit.clients import runner
from fedvit.core.config import parse_config
from fedvit.core.model import build_model, get_weights
from fedvit.strategies.secagg import BOUND_METRIC, DROPPED

pytestmark = [pytest.mark.deployment, pytest.mark.xdist_group("secagg-loopback"), pytest.mark.long]
ROOT = Path(__file__).resolve().parents[1]
NODES, VICTIM = 5, 3
SHARED_KEYS = 2  # setup and share keys: the victim holds shares of the others' secrets when it dies
SENT_IN_ROUND_ONE = re.compile(r"\[RUN \d+, ROUND 1\]\n[^\n]*Sending: train message[^\n]*\n[^\n]*Sent successfully")


def round_one_replies_sent(log: Path) -> int:
    """How many round-1 train replies (SecAgg+ stages) a SuperNode has finished uploading: Flower logs "Sent
    successfully" once the reply's last object reached the SuperLink. (The clients' capture is written before the
    upload: killing on it once caught the victim mid-upload, and the server then waited for the lost reply's objects
    until the SuperLink's push session expired.)"""
    text = log.read_text(errors="replace") if log.exists() else ""
    return len(SENT_IN_ROUND_ONE.findall(text))


def test_a_secagg_run_survives_a_killed_supernode_and_equals_fedavg_of_the_survivors(tmp_path):
    out, name = tmp_path / "out", "secagg"
    overrides = {
        "out-dir": str(out), "run-name": name, "num-server-rounds": 2, "strategy": "fedavg", "lr": 0.05,
        "min-nodes": NODES - 1, "round-timeout": 120.0, "fraction-evaluate": 0.0, "capture.enabled": True,
        "secagg.enabled": True, "secagg.reconstruction-threshold": 3,
    }  # fmt: skip
    argv = [executable("python"), "-m", "fedvit.app.cli", "run", str(ROOT), "fedvit-loopback"]
    for key, value in overrides.items():
        argv += ["-c", f"{key}={json.dumps(value) if not isinstance(value, str) else repr(value)}"]
    with LoopbackDeployment(tmp_path / "loopback", NODES) as deployment:
        run = subprocess.Popen(argv, env=deployment.cli_env(), cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)  # fmt: skip
        try:
            deadline = time.monotonic() + 400
            while round_one_replies_sent(deployment.log_of(supernode_name(VICTIM))) < SHARED_KEYS:
                assert run.poll() is None and time.monotonic() < deadline, "the victim never shared its keys"
                time.sleep(0.2)
            deployment.kill(supernode_name(VICTIM), signal.SIGKILL)
            output, _ = run.communicate(timeout=600)
        finally:
            if run.poll() is None:
                run.kill()
    assert run.returncode == 0, output[-5000:]
    rounds = {e["round"]: e for e in json.loads((out / name / "metrics.json").read_text())["rounds"]}
    survivors = [p for p in range(NODES) if p != VICTIM]
    first, second = rounds[1], rounds[2]
    assert first["sampled"] == list(range(NODES)) and first["aggregated"] == survivors
    assert first["rejected"] == {str(VICTIM): DROPPED}
    assert second["aggregated"] == survivors and set(survivors) <= set(second["sampled"])
    assert "Secure aggregation completed" in output and "secagg: SecAgg+ with" in output

    # round 1's model is FedAvg over exactly the survivors' training, computed here, within the stated bound
    import torch

    torch.set_num_threads(1)  # as the loopback ClientApps (OMP_NUM_THREADS=1): the same float reduction order
    config = parse_config(overrides | {"capture.enabled": False, "run-name": ""})
    start = get_weights(build_model(config.model, config.data.synthetic_num_classes, config.seed))
    replies = [runner.train(config, p, NODES, start, 1, config.lr) for p in survivors]
    total = sum(int(m["num-examples"]) for _, m in replies)
    round_one = load_file(out / name / "checkpoints" / "round-0001.safetensors")
    difference = max(
        float(np.abs(sum(int(m["num-examples"]) / total * r["arrays"][k].astype(np.float64) for r, m in replies)
                     - round_one[k]).max())
        for k in start
    )  # fmt: skip
    assert difference <= first[BOUND_METRIC] + 1e-6, (difference, first[BOUND_METRIC])
