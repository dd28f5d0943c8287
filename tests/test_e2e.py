"""Real ``flwr run`` simulations (3 SuperNodes, synthetic data) through the ``fedvit run`` CLI.

Each test run uses its own FLWR_HOME and free ports and stops the local SuperLink it started.
"""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.numpy import load_file

from fedvit.app.flower_processes import private_superlink_env, stop_local_superlink

# spread over the xdist workers: each worker's module fixture has its own SuperLink; long: scheduled first (conftest)
pytestmark = [pytest.mark.e2e, pytest.mark.long]
ROOT = Path(__file__).parents[1]
FEDERATION = "num-supernodes=3 client-resources-num-cpus=1"


@pytest.fixture(scope="module")
def flower(tmp_path_factory):
    home = tmp_path_factory.mktemp("flwr-home")
    env = private_superlink_env(home) | {"FEDVIT_CLIENT_STATE": str(tmp_path_factory.mktemp("client-state"))}
    out = tmp_path_factory.mktemp("outputs")

    def run(*overrides: str) -> subprocess.CompletedProcess:
        cmd = [
            sys.executable,
            "-m",
            "fedvit.app.cli",
            "run",
            str(ROOT),
            "--federation-config",
            FEDERATION,
            "-c",
            f"out-dir='{out}' num-server-rounds=3 fraction-train=0.67",
        ]
        for override in overrides:
            cmd += ["-c", override]
        proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600, umask=0o022)
        print(proc.stdout[-4000:])
        return proc

    run.env, run.home = env, home
    yield run, out
    stop_local_superlink(home)
    assert not stop_local_superlink(home), "SuperLink still running after teardown"


def model(path: Path) -> dict:
    """Model weights of a model.safetensors or checkpoint file (without the strategy state)."""
    return {k: v for k, v in load_file(str(path)).items() if not k.startswith("strategy/")}


def assert_identical(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert (a[k] == b[k]).all(), f"{k} differs"


def test_plain_fedsgd_learns_and_writes_outputs(flower):
    run, out = flower
    proc = run("run-name='plain'")
    assert proc.returncode == 0, proc.stdout[-2000:]
    rounds = json.loads((out / "plain" / "metrics.json").read_text())["rounds"]
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
        assert (out / "plain" / name).is_file(), name
        # readable by others, as a plain open() under umask 022 gives (mkstemp's 0600 used to survive the rename)
        assert stat.S_IMODE((out / "plain" / name).stat().st_mode) == 0o644, name
    assert "round 3/3 | loss" in proc.stdout


MASKED = "strategy='masked-fedsgd' mask.mode='fresh' mask.r=0.5"


def test_masked_fedsgd_learns_reproduces_and_resumes(flower, monkeypatch):
    """A real run stops after round 2 and resumes to round 3; the result is bit-identical to an uninterrupted
    3-round run made in this process (same code without Ray: the two runtimes agree to the bit)."""
    from tests.helpers import run_in_process

    run, out = flower
    first = run("run-name='part'", MASKED, "num-server-rounds=2")
    assert first.returncode == 0, first.stdout[-2000:]
    resumed = run(f"resume-from='{out / 'part'}'", MASKED)
    assert resumed.returncode == 0, resumed.stdout[-2000:]
    rounds = json.loads((out / "part" / "metrics.json").read_text())["rounds"]
    assert [r["round"] for r in rounds] == [0, 1, 2, 3]
    assert rounds[-1]["central-accuracy"] > rounds[0]["central-accuracy"]
    # about half of the entries are sent, so the uplink is about half + 1/32 of dense FedSGD's
    assert all(0.45 < r["kept-fraction"] < 0.55 for r in rounds[1:])
    counts = json.loads((out / "part" / "update-counts.json").read_text())
    assert counts["rounds"] == 3 and counts["clients-per-round"] == [2, 2, 2]

    # The uninterrupted reference, with the same client-private state (mask seeds) as the real clients.
    monkeypatch.setenv("FEDVIT_CLIENT_STATE", run.env["FEDVIT_CLIENT_STATE"])
    config = dict(json.loads((out / "part" / "config.json").read_text()))
    config |= {"run-name": "reference", "resume-from": "", "num-server-rounds": 3}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in the Ray actors (client-resources-num-cpus=1): same reduction order
    try:
        reference, _ = run_in_process(config, num_nodes=3)
    finally:
        torch.set_num_threads(threads)
    assert_identical(model(out / "part" / "model.safetensors"), model(reference / "model.safetensors"))
    assert json.loads((reference / "update-counts.json").read_text()) == counts


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


def test_encrypted_private_init_run_keeps_the_key_off_the_server(flower):
    """Real flwr run, key in the clients' default location: federated accuracy every round, no key material
    in the outputs, the logs or anything under FLWR_HOME (the SuperLink's state included)."""
    from fedvit.clients.encryption import ENCRYPTED, EncryptionKey
    from tests.helpers import find_key_material

    run, out = flower
    key = EncryptionKey.generate(192, 16, seed=11)  # the tiny default model
    key.save(Path(run.env["FEDVIT_CLIENT_STATE"]) / "encryption-key.safetensors")
    proc = run(
        "run-name='encrypted'",
        "encryption.mode='private-init' centralized-evaluation=false batch-size=1",
        "capture.enabled=true capture.ground-truth=true",  # the eavesdropper under Flower's real runtime
    )
    assert proc.returncode == 0, proc.stdout[-2000:]
    rounds = json.loads((out / "encrypted" / "metrics.json").read_text())["rounds"]
    assert all("eval-accuracy" in r and "central-accuracy" not in r for r in rounds[1:])
    state = load_file(str(out / "encrypted" / "checkpoints" / "round-0003.safetensors"))
    agreed = {n: state[f"strategy/encryption/agreed/{n}"] for n in ENCRYPTED}
    secret = key.private_initial_embeddings({n: a.shape for n, a in agreed.items()})
    for name in ENCRYPTED:
        assert abs(key.decrypt(agreed)[name] - secret[name]).max() < 1e-6
    blobs = {str(p): p.read_bytes() for root in (out / "encrypted", run.home) for p in root.rglob("*") if p.is_file()}
    blobs["stdout"], blobs["stderr"] = proc.stdout.encode(), proc.stderr.encode()
    assert find_key_material(key, blobs) == []
    # the captures (in the scan above) hold the handshake and 2 clients x 3 rounds; the keyless attack sees noise
    from fedvit.app.cli import main

    captured = sorted((out / "encrypted").glob("run-*/captures/round-*/node-*.json"))
    assert len(captured) == 3 + 6, [p.name for p in captured]
    budget = ["-c", "audit.iterations=20", "-c", "audit.restarts=1"]
    assert main(["audit", str(out / "encrypted"), "--out", str(out / "audit"), *budget]) == 0
    rows = json.loads((out / "audit" / "audit.json").read_text())["rows"]
    naive = [r for r in rows if r["attack"] == "APRIL-E (naive)"]
    assert len(naive) == 6 and all(r["psnr"] < 20 for r in naive)
    assert all(r["psnr"] is None for r in rows if r["attack"] == "known-plaintext")
    key_file = Path(run.env["FEDVIT_CLIENT_STATE"]) / "encryption-key.safetensors"
    assert find_key_material(key, {"key file": key_file.read_bytes()}) == ["key file"]  # the scan can fail


def test_adversarial_training_with_fedwavg_reports_natural_and_robust_accuracy_every_round(flower):
    run, out = flower
    proc = run(
        "run-name='fat' strategy='fedwavg' fedwavg.q=10.0 lr=0.05 momentum=0.9 num-server-rounds=2 "
        "fraction-train=1.0 batch-size=32 data.augment='crop-flip'",
        "adversarial.enabled=true adversarial.steps=3 robust.enabled=true robust.steps=5 robust.max-samples=16",
        "robust.attack='autoattack' robust.version='apgd' robust.every=10",  # AutoAttack in the last round only
    )
    assert proc.returncode == 0, proc.stdout[-3000:]
    rounds = json.loads((out / "fat" / "metrics.json").read_text())["rounds"]
    assert [r["round"] for r in rounds] == [0, 1, 2]
    # PGD every round, AutoAttack in the last: no weaker than PGD on the same images, and said what it was.
    assert [("central-autoattack-accuracy" in r, "eval-autoattack-accuracy" in r) for r in rounds] == [
        (False, False),
        (False, False),
        (True, True),
    ]
    last = rounds[-1]
    assert last["central-autoattack-accuracy"] <= last["central-robust-accuracy"]
    assert last["eval-autoattack-accuracy"] <= last["eval-robust-accuracy"]
    assert last["autoattack"] == {"version": "apgd", "norm": "Linf", "eps-255": 8.0, "samples": 16,
                                  "client-max-samples": 16}  # fmt: skip
    saved = json.loads((out / "fat" / "config.json").read_text())
    assert (saved["robust.attack"], saved["robust.version"], saved["robust.max-samples"]) == ("autoattack", "apgd", 16)
    for r in rounds:
        assert 0.0 <= r["central-accuracy"] <= 1.0 and 0.0 <= r["central-robust-accuracy"] <= 1.0
    for r in rounds[1:]:
        assert 0.0 <= r["eval-accuracy"] <= 1.0 and 0.0 <= r["eval-robust-accuracy"] <= 1.0
        assert r["adversarial-samples"] > 0  # Madry AT replaced samples on the clients
        assert sum(r["aggregation"]["weights"].values()) == pytest.approx(1.0)
    assert "round 2/2 | loss" in proc.stdout and "robust" in proc.stdout
    assert (out / "fat" / "plots" / "fedwavg-weights.png").is_file()
