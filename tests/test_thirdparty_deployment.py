"""A third-party Flower app (tests/thirdparty_app: Flower's CNN and FedAvg, nothing of fedvit) deployed on
127.0.0.1 with real SuperLink/SuperNode processes, eavesdropped by ``fedvit tap`` and audited with
``fedvit audit --model``; the same deployment without the tap (bit-equal final model) and over TLS (nothing
readable). Node 0 holds partition 0 (1 image), node 1 partition 3 (4 images): B = 1 and B = 4, one local step.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from fedvit.app.deployment.connection import add_connection
from fedvit.app.deployment.credentials import register_command, write_credentials
from fedvit.app.deployment.loopback import wait_for_port
from fedvit.app.deployment.topology import supernode_name
from fedvit.app.flower_processes import executable, flower_env, free_ports

# xdist: the module's deployment is started once
pytestmark = [pytest.mark.deployment, pytest.mark.xdist_group("thirdparty-deployment")]
APP = Path(__file__).parent / "thirdparty_app"
PARTITIONS = (0, 3)  # partition-sizes "1,2,3,4": one image and four
sys.path.insert(0, str(APP))


class Federation:
    """SuperLink and two SuperNodes (subprocess isolation), the SuperNodes dialling ``dial`` (the tap or the
    SuperLink itself); TLS and SuperNode authentication when ``tls``. Every process in its own session, ended by
    :meth:`stop`."""

    def __init__(self, workdir: Path, tls: bool = False, app: Path = APP, partitions: tuple[int, ...] = PARTITIONS,
                 num_partitions: int = 4) -> None:  # fmt: skip
        self.workdir, self.tls, self.app = workdir, tls, app
        self.partitions, self.num_partitions = partitions, num_partitions
        self.link_port, self.tap_port, *self.node_ports = free_ports(2 + len(partitions))
        self.procs: list[subprocess.Popen] = []
        self.credentials = workdir / "credentials"
        if tls:
            write_credentials(self.credentials, len(partitions))

    def env(self, name: str) -> dict[str, str]:
        return flower_env() | {"FLWR_HOME": str(self.workdir / "homes" / name), "OMP_NUM_THREADS": "1",
                               "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1"}  # fmt: skip

    def spawn(self, name: str, argv: list[str]) -> subprocess.Popen:
        (self.workdir / "logs").mkdir(parents=True, exist_ok=True)
        with open(self.workdir / "logs" / f"{name}.log", "ab") as log:
            proc = subprocess.Popen([executable(argv[0]), *argv[1:]], env=self.env(name), stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        self.procs.append(proc)
        return proc

    def security(self, role: str) -> list[str]:
        if not self.tls:
            return ["--insecure"]
        cred = self.credentials
        if role == "superlink":  # TLS and SuperNode authentication, as Flower's supernode-authentication example
            return ["--ssl-ca-certfile", str(cred / "ca.crt"), "--ssl-certfile", str(cred / "superlink.crt"),
                    "--ssl-keyfile", str(cred / "superlink.key"), "--enable-supernode-auth"]  # fmt: skip
        return ["--root-certificates", str(cred / "ca.crt"), "--auth-supernode-private-key",
                str(cred / f"{supernode_name(int(role.rpartition('-')[2]))}.auth")]  # fmt: skip

    def start_superlink(self) -> None:
        link = self.spawn("superlink", ["flower-superlink", *self.security("superlink"), "--host", "127.0.0.1",
                                        "--port", str(self.link_port), "--disable-runtime-dependency-installation",
                                        "--database", str(self.workdir / "state.db")])  # fmt: skip
        wait_for_port(self.link_port, link, self.workdir / "logs" / "superlink.log")

    def start_supernodes(self, dial: int) -> None:
        if self.tls:  # each SuperNode's public key registered with the SuperLink before it connects
            home = self.workdir / "homes" / "cli"
            add_connection(home, "thirdparty", f"127.0.0.1:{self.link_port}", self.credentials / "ca.crt")
            for i in range(len(self.partitions)):
                done = subprocess.run(register_command(executable("flwr"), self.credentials, i, "thirdparty"),
                                      env=self.env("cli"), capture_output=True, text=True, timeout=120)  # fmt: skip
                assert done.returncode == 0, done.stdout + done.stderr
        for i, (partition, port) in enumerate(zip(self.partitions, self.node_ports, strict=True)):
            node_config = f"partition-id={partition} num-partitions={self.num_partitions}"
            argv = ["flower-supernode", *self.security(f"supernode-{i}"), "--superlink", f"127.0.0.1:{dial}",
                    "--port", str(port), "--node-config", node_config]  # fmt: skip
            node = self.spawn(f"supernode-{i}", argv)
            wait_for_port(port, node, self.workdir / "logs" / f"supernode-{i}.log")

    def run(self, final_model: Path, rounds: int, extra: str = "") -> subprocess.CompletedProcess:
        home = self.workdir / "homes" / "cli"
        ca = self.credentials / "ca.crt" if self.tls else None
        add_connection(home, "thirdparty", f"127.0.0.1:{self.link_port}", ca)
        overrides = f"final-model='{final_model}' num-server-rounds={rounds} {extra}".strip()
        argv = [executable("flwr"), "run", str(self.app), "thirdparty", "--stream", "-c", overrides]
        done = subprocess.run(argv, env=self.env("cli"), capture_output=True, text=True, timeout=420, cwd=self.app)
        print(done.stdout[-3000:], done.stderr[-3000:])
        return done

    def stop(self) -> None:
        for proc in self.procs:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(proc.pid, sig)
                    proc.wait(timeout=10)
                    break
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    continue


def fedvit(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fedvit.app.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=flower_env())  # fmt: skip


def start_tap(fed: Federation, out: Path) -> subprocess.Popen:
    argv = ["fedvit.app.cli", "tap", "--listen", f"127.0.0.1:{fed.tap_port}", "--upstream",
            f"127.0.0.1:{fed.link_port}", "--out", str(out)]  # fmt: skip
    with open(fed.workdir / "logs" / "tap.log", "ab") as log:
        tap = subprocess.Popen([sys.executable, "-m", *argv], stdout=log, stderr=subprocess.STDOUT,
                               env=flower_env(), start_new_session=True)  # fmt: skip
    wait_for_port(fed.tap_port, tap, fed.workdir / "logs" / "tap.log")
    return tap


def stop_tap(tap: subprocess.Popen) -> None:
    os.killpg(tap.pid, signal.SIGTERM)
    tap.wait(timeout=60)


def deploy(
    workdir: Path, through_tap: bool, tls: bool = False, rounds: int = 2, extra: str = "", app: Path = APP,
    partitions: tuple[int, ...] = PARTITIONS,
) -> tuple[subprocess.CompletedProcess, Path, Path]:  # fmt: skip
    """One run of ``app`` (``extra``: run-config overrides) on one SuperNode per partition; returns flwr's result,
    the final model and the tap's folder."""
    fed = Federation(workdir, tls, app, partitions)
    captures, final = workdir / "captures", workdir / "final.pt"
    tap = None
    try:
        fed.start_superlink()
        (workdir / "logs").mkdir(parents=True, exist_ok=True)
        if through_tap:
            tap = start_tap(fed, captures)
        fed.start_supernodes(fed.tap_port if through_tap else fed.link_port)
        started = time.monotonic()
        done = fed.run(final, rounds, extra)
        print(f"flwr run took {time.monotonic() - started:.1f} s ({'tap' if through_tap else 'direct'}, tls {tls})")
    finally:
        fed.stop()
        if tap is not None:
            stop_tap(tap)
    return done, final, captures


def partition_labels(partition: int) -> dict[int, int]:
    from cnnapp_partitions import partition as load

    labels = load(partition)[1]
    return {str(c): int(n) for c, n in zip(*np.unique(labels, return_counts=True), strict=True)}  # as in JSON


@pytest.fixture(scope="module")
def plain_run(tmp_path_factory):
    return deploy(tmp_path_factory.mktemp("direct"), through_tap=False)


def test_tap_records_a_third_party_deployment_that_trains_bit_identically_and_the_audit_gets_the_labels(
    tmp_path, plain_run
):
    done, final, captures = deploy(tmp_path / "tapped", through_tap=True)
    assert final.exists(), done.stdout[-2000:]
    direct_done, direct_final, _ = plain_run
    assert direct_final.exists(), direct_done.stdout[-2000:]
    tapped, direct = torch.load(final), torch.load(direct_final)
    assert tapped.keys() == direct.keys() and all(torch.equal(tapped[k], direct[k]) for k in tapped)

    summary = json.loads((captures / "tap.json").read_text())
    assert summary["records"]["parse-errors"] == 0 and summary["records"]["sent"] >= 4, summary
    manifests = sorted(captures.glob("run-*/captures/round-*/node-*.json"))
    trains = [m for m in manifests if m.stem.split("-")[-1].isdigit()]
    assert len(trains) == 4  # 2 rounds x 2 nodes
    manifest = json.loads(trains[0].read_text())
    assert manifest["received"]["config"]["config"]["lr"] == 0.05
    run = json.loads((trains[0].parents[2] / "run.json").read_text())  # the FAB's defaults fused with overrides
    assert run["run_config"]["batch-size"] == 4 and run["run_config"]["final-model"] == str(final)

    # Which node holds which partition: the user knows their nodes; here each node's batch size tells it.
    sizes = {json.loads(m.read_text())["node"]: json.loads(m.read_text())["sent"]["metrics"]["metrics"]["num-examples"]
             for m in trains}  # fmt: skip
    mapping = [f"--partition={node}={PARTITIONS[0] if size == 1 else PARTITIONS[1]}" for node, size in sizes.items()]
    out = tmp_path / "audit"
    audit = fedvit("audit", str(captures), "--out", str(out), "--model", "cnnapp.task:Net", "--app-dir", str(APP),
                   "--data", "cnnapp_partitions:partition", *mapping, "--decoy-partitions", "4-60",
                   "--iterations", "40", "--restarts", "1")  # fmt: skip
    assert audit.returncode == 0, audit.stdout[-3000:] + audit.stderr[-3000:]
    report = json.loads((out / "audit.json").read_text())
    assert len(report["updates"]) == 4
    for row in report["updates"]:
        partition = row["partition"]
        assert row["labels"] == partition_labels(partition), row
        assert row["batch"] == (1 if partition == PARTITIONS[0] else 4) and row["steps"] == 1
        assert row["label-accuracy"] == 1.0 and row["reid-top1"] is not None
    # exact counts clear the prior exactly where the update holds enough images for their interval to clear it
    cleared = [u["update"] for u in report["updates"] if u["leakage"]["labels"]["clears"]]
    assert cleared == [u["update"] for u in report["updates"]
                       if u["examples"] >= u["leakage"]["labels"]["images-needed"]], report["updates"]
    # 1 and 4 images: no update alone can clear its prior (the intervals reach it), the two clients together do
    assert not cleared and "labels beyond the null in 0 of 4 update(s)" in report["verdict-detail"], report[
        "verdict-detail"]  # fmt: skip
    assert "4 of 4 exactly right" in report["verdict-detail"]
    assert "Together: labels of the 2 clients together beyond the prior (0 of 5 images misplaced" in report[
        "verdict"], report["verdict"]  # fmt: skip
    assert (out / "grid.png").exists() and "Verdict" in (out / "audit.md").read_text()
    from fedvit.audit.report import TOP_LEVEL_KEYS

    assert tuple(report) == TOP_LEVEL_KEYS  # the one report schema, as for fedvit's own runs


def test_over_tls_the_tap_relays_but_records_nothing_readable(tmp_path):
    done, final, captures = deploy(tmp_path / "tls", through_tap=True, tls=True, rounds=1)
    assert final.exists(), done.stdout[-2000:]  # the federation trained through the tap
    assert not list(captures.rglob("*.safetensors")) and not list(captures.rglob("node-*.json"))
    assert not (captures / "fabs").exists()  # the app bundle crossed the link encrypted too
    links = [json.loads(line) for line in (captures / "connections.jsonl").read_text().splitlines()]
    assert links and all(link["protocol"] == "tls" and not link["readable"] for link in links)
    out = tmp_path / "audit"
    audit = fedvit("audit", str(captures), "--out", str(out), "--model", "cnnapp.task:Net", "--app-dir", str(APP))
    assert audit.returncode == 0, audit.stderr
    assert "the wire shows nothing; the server still sees every update" in (out / "audit.md").read_text()
    assert "no app bundle to read the client's recipe from: give --app" in (out / "audit.md").read_text()
    counted = json.loads((captures / "tap.json").read_text())["connections"]["tls"]
    report = json.loads((out / "audit.json").read_text())
    assert counted >= len(links) and f"({counted} TLS or HTTP/2 link(s) in tap.json)" in report["threat-model"]
    assert report["threat-model"].startswith("passive eavesdropper on the wire, every link TLS")


def test_the_tap_stops_cleanly_and_says_what_it_saw(tmp_path):
    """A tap with no traffic still writes its summary on SIGTERM (the CLI's shutdown path)."""
    fed = Federation(tmp_path)
    (tmp_path / "logs").mkdir()
    tap = start_tap(fed, tmp_path / "out")
    time.sleep(0.5)
    stop_tap(tap)
    assert tap.returncode == 0
    assert json.loads((tmp_path / "out" / "tap.json").read_text())["connections"] == {"http": 0, "tls": 0, "http2": 0}


def replayed_partition(manifest: Path, candidates: range) -> tuple[int, list[float]]:
    """The partition a tapped node trained on, by replaying cnnapp's own training (its seed, epochs, lr, batch) from
    the weights the node received on each candidate partition: the one whose replay lands on the sent weights
    (the truth, found without the audit's method); the replays' distances to the sent weights beside it."""
    from cnnapp.task import Net, train
    from cnnapp_partitions import skewed

    from fedvit.capture.reader import load_exchanges

    (ex,) = [e for e in load_exchanges(manifest.parent)[0] if e.stem.name == manifest.stem]
    config, run_config = ex.received_config, ex.run_config
    distances = []
    for p in candidates:
        model = Net()
        model.load_state_dict({k: torch.as_tensor(v) for k, v in ex.received.items()})
        train(model, *skewed(p), int(config["local-epochs"]), float(config["lr"]), int(run_config["batch-size"]),
              int(run_config["seed"]) * 100 + int(config["server-round"]))  # fmt: skip
        sent = model.state_dict()
        distances.append(float(sum(np.abs(sent[k].numpy() - ex.sent[k]).sum() for k in ex.sent)))
    return int(np.argmin(distances)), distances


def test_the_audit_matches_four_tapped_nodes_with_dirichlet_partitions_to_their_own(tmp_path):
    """Four SuperNodes of 24 images each with Dirichlet(0.3) classes, deployed through ``fedvit tap`` (which records
    no partition ids), audited with ``--data`` and no ``--partition``: every node is matched to the partition a
    replay of its own training says it trained on, and scored against it."""
    from cnnapp_partitions import SKEWED_ALPHA, SKEWED_SIZES

    done, final, captures = deploy(tmp_path / "tapped", through_tap=True, rounds=1, partitions=(0, 1, 2, 3),
                                   extra=f"partition-sizes='{SKEWED_SIZES}' dirichlet-alpha={SKEWED_ALPHA}")
    assert final.exists(), done.stdout[-2000:]
    trains = sorted(m for m in captures.glob("run-*/captures/round-*/node-*.json") if m.stem.split("-")[-1].isdigit())
    assert len(trains) == 4 and all(json.loads(m.read_text()).get("partition") is None for m in trains)
    truth = {}
    for manifest in trains:
        partition, distances = replayed_partition(manifest, range(4))
        assert sorted(distances)[0] < 1e-3 * sorted(distances)[1], distances  # one replay lands, the others do not
        truth[manifest.stem.removeprefix("node-")] = partition
    assert sorted(truth.values()) == [0, 1, 2, 3]
    out = tmp_path / "audit"
    audit = fedvit("audit", str(captures), "--out", str(out), "--model", "cnnapp.task:Net", "--app-dir", str(APP),
                   "--input", "3,32,32", "--data", "cnnapp_partitions:skewed", "--leakage", "labels")  # fmt: skip
    assert audit.returncode == 0, audit.stdout[-3000:] + audit.stderr[-3000:]
    report = json.loads((out / "audit.json").read_text())
    assert {str(u["node"]): u["partition"] for u in report["updates"]} == truth
    (note,) = [n for n in report["notes"] if n.startswith("node → partition inferred")]
    assert note.count("(inferred, fit") == 4 and "runner-up partition" in note
