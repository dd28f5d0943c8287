"""Loopback deployment: the compose topology as real processes on 127.0.0.1 with TLS and SuperNode auth.

Slow (Flower's SuperNodes poll every 3 s and start a ClientApp process per message; fedvit-superexec forks it
from a warm parent): marked ``deployment``, excluded from the default suite, run by CI as its own step.
The tests share one deployment and run in file order; the fault test goes last because it kills a SuperNode.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from fedvit.app.deployment.credentials import write_credentials
from fedvit.app.deployment.loopback import LoopbackDeployment
from fedvit.app.deployment.topology import processes
from fedvit.app.flower_processes import executable, free_ports

# xdist: the module's deployment is started once
pytestmark = [pytest.mark.deployment, pytest.mark.xdist_group("loopback")]
ROOT = Path(__file__).resolve().parents[1]
NODES = 3
REJECT_TIMEOUT_S = 90


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    with LoopbackDeployment(tmp_path_factory.mktemp("loopback"), NODES) as d:
        yield d
    for name, proc in d.procs.items():  # stop() ended every process it started
        assert proc.poll() is not None, name


def metrics(run_dir: Path) -> dict[int, dict]:
    return {e["round"]: e for e in json.loads((run_dir / "metrics.json").read_text())["rounds"]}


def supernode_with(deployment: LoopbackDeployment, name: str, replace: dict[str, str | None]) -> subprocess.Popen:
    """An extra SuperNode: supernode-1's command with some flags replaced (value None: flag dropped)."""
    argv = list(processes(deployment.layout)[2].argv)
    for flag, value in replace.items():
        i = argv.index(flag) if flag in argv else None
        if i is not None and value is None:
            del argv[i : i + (1 if argv[i + 1].startswith("--") else 2)]
        elif i is not None:
            argv[i + 1] = value
        else:
            argv.append(flag)
    argv[argv.index("--port") + 1] = str(free_ports(1)[0])
    return deployment.spawn(processes(deployment.layout)[2], argv=argv, name=name)


def test_unregistered_and_insecure_supernodes_are_rejected(deployment, tmp_path):
    write_credentials(tmp_path, 1)  # a valid key pair that was never registered
    unregistered_key = str(tmp_path / "supernode-1.auth")
    cases = {
        "unregistered": supernode_with(deployment, "unregistered", {"--auth-supernode-private-key": unregistered_key}),
        "insecure": supernode_with(deployment, "insecure", {"--root-certificates": None, "--insecure": ""}),
    }
    for name, proc in cases.items():
        try:
            code = proc.wait(timeout=REJECT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            pytest.fail(f"the {name} SuperNode was still running after {REJECT_TIMEOUT_S} s")
        log = deployment.log_of(name).read_text()
        assert code != 0, (name, log[-2000:])
    assert "Failed to activate SuperNode" in deployment.log_of("unregistered").read_text()
    # The real SuperNodes are unaffected.
    assert all(p.poll() is None for n, p in deployment.procs.items() if n not in cases)


def test_two_rounds_over_tls_with_authenticated_supernodes(deployment, tmp_path):
    out = tmp_path / "out"
    done = deployment.run(
        ROOT, [f"out-dir='{out}'", "run-name='two-rounds'", "num-server-rounds=2", f"min-nodes={NODES}"]
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "finished:completed" in done.stdout
    rounds = metrics(out / "two-rounds")
    assert sorted(rounds) == [0, 1, 2]
    for rnd in (1, 2):
        assert sorted(rounds[rnd]["sampled"]) == list(range(NODES))
        assert rounds[rnd]["rejected"] == {}
        assert 0.0 <= rounds[rnd]["central-accuracy"] <= 1.0 and 0.0 <= rounds[rnd]["eval-accuracy"] <= 1.0
    assert (out / "two-rounds" / "model.safetensors").is_file()
    assert [rounds[rnd]["messages"] for rnd in (1, 2)] == [NODES, 2 * NODES]  # round 1's evaluation rode along
    # The same run in one process (the simulation's code path) ends with the same global model and metrics.
    import torch

    from tests.helpers import run_in_process

    torch.set_num_threads(1)  # as the loopback ClientApps (OMP_NUM_THREADS=1): same float reduction order
    config = {"out-dir": str(tmp_path / "local"), "run-name": "local", "num-server-rounds": 2, "min-nodes": NODES}
    local_dir, _ = run_in_process(config, NODES)
    deployed, local = load_file(out / "two-rounds" / "model.safetensors"), load_file(local_dir / "model.safetensors")
    assert sorted(deployed) == sorted(local)
    for name in local:
        np.testing.assert_allclose(deployed[name], local[name], rtol=0, atol=1e-6, err_msg=name)
    local_rounds = metrics(local_dir)
    for rnd in (1, 2):
        assert rounds[rnd]["eval-accuracy"] == pytest.approx(local_rounds[rnd]["eval-accuracy"], abs=1e-9)
    topology = [deployment.procs[p.name] for p in processes(deployment.layout)]
    assert all("--insecure" not in proc.args and proc.poll() is None for proc in topology)


def test_killed_supernode_round_aggregates_the_survivors_and_the_run_finishes(deployment, tmp_path):
    out, name = tmp_path / "out", "fault"
    overrides = [
        f"out-dir='{out}'", f"run-name='{name}'", "num-server-rounds=2", "strategy='fedavg'", "lr=0.05",
        "min-nodes=2", "round-timeout=150.0", "fraction-evaluate=0.0", "capture.enabled=true",
    ]  # fmt: skip
    argv = [executable("python"), "-m", "fedvit.app.cli", "run", str(ROOT), "fedvit-loopback"]
    argv += [a for o in overrides for a in ("-c", o)]
    pipe = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True}
    run = subprocess.Popen(argv, env=deployment.cli_env(), cwd=ROOT, **pipe)
    victim = NODES - 1
    try:
        deadline = time.monotonic() + 400
        while not ((out / name / "metrics.json").exists() and 1 in metrics(out / name)):
            assert run.poll() is None and time.monotonic() < deadline, "round 1 did not finish"
            time.sleep(0.5)
        deployment.kill(f"supernode-{victim + 1}", signal.SIGKILL)
        output, _ = run.communicate(timeout=600)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 0, output[-4000:]
    second = metrics(out / name)[2]
    survivors = [p for p in range(NODES) if p != victim]
    assert set(survivors) <= set(second["sampled"])
    if victim in second["sampled"]:  # sampled before the SuperLink noticed: its failure is logged
        assert str(victim) in second["rejected"], second
        assert f"rejected reply of partition {victim}" in output
    # The new global model is FedAvg over exactly the survivors' replies (as the server received them).
    replies = {}
    for path in (out / name).glob("run-*/captures/server/round-0002/node-*.json"):  # the server's view
        manifest = json.loads(path.read_text())
        reported = manifest.get("sent", {}).get("metrics", {}).get("metrics", {})
        if reported.get("partition-id") in survivors:
            stem = path.with_suffix("")
            replies[reported["partition-id"]] = (reported["num-examples"], load_file(f"{stem}.sent.safetensors"))
    assert sorted(replies) == survivors
    assert second["num-examples"] == sum(n for n, _ in replies.values())
    final = load_file(out / name / "model.safetensors")
    total = sum(n for n, _ in replies.values())
    for key, value in final.items():
        expected = sum(n / total * arrays[f"arrays/{key}"].astype(np.float64) for n, arrays in replies.values())
        np.testing.assert_allclose(value, expected, rtol=0, atol=1e-6, err_msg=key)
