"""Per-host bundles run as separate hosts on a real Docker engine, and the faults a real federation meets.

Marked ``compose`` (CI: ``uv run --frozen --group compose pytest -m compose``; runs after tests/test_compose.py,
whose images it reuses). ``fedvit deploy bundle`` writes a server bundle and one per client; each is brought up as
its own compose project with its own network, and the SuperNodes dial the SuperLink only at the host's published
port (the docker0 address, as a remote machine would dial the server's address), TLS and SuperNode authentication
on. Then: a 2-round run; a client host that dies and comes back; a client host cut from the network for a round;
the SuperLink restarting mid-run; the ServerApp executor crashing. Each fault's figures (time to recover, rounds
lost, the run's status) are printed and written to ``benchmarks/results/multihost-faults.json``.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from fedvit.app.deployment.bundle import check_bundles
from fedvit.app.deployment.topology import SUPERLINK_PORT
from tests.docker_engine import compose_env, docker_engine, install_missing
from tests.test_compose import APP_UID, copy_app, metrics, port_free

# xdist: one Docker stack at a time
pytestmark = [pytest.mark.compose, pytest.mark.xdist_group("docker")]
ROOT = Path(__file__).resolve().parents[1]
CLIENTS = 3
PREFIX = "fedvit-mh"  # compose project names: fedvit-mh-server, fedvit-mh-client-1, ...
CONNECTION = "fedvit-mh"
FIGURES_FILE = ROOT / "benchmarks" / "results" / "multihost-faults.json"
RUN_TIMEOUT_S = 900
# Every round waits until all clients are connected. Runs compared bit for bit need them all; a fault test needs it
# to tell "the client came back" from "the run ended first": with min-nodes=2 the rounds went on without the lost
# client, and in one CI run all 4 later rounds ended before it returned.
ALL_CLIENTS = f"min-nodes={CLIENTS}"
# Runs compared bit for bit also refuse a round short of any client: after a SuperLink restart, round 2 once went
# to nodes the restarted SuperLink still listed, two came back "node unavailable", and the round aggregated the
# third alone (CI, 1 of 3 replies). With accept-failures=false such a round stops the run, and the resume redoes it.
BIT_EQUAL = f"{ALL_CLIENTS} accept-failures=false"


def bridge_address() -> str:
    """The host's address on docker0: what a container on any network dials to reach a published port."""
    done = subprocess.run(["ip", "-4", "-o", "addr", "show", "docker0"], capture_output=True, text=True, check=True)
    return done.stdout.split()[3].split("/")[0]


class Federation:
    """The bundles' compose projects, the app copy the CLI runs, and the figures the fault tests measure."""

    def __init__(self, work: Path, app: Path, bundles: Path, env: dict[str, str]) -> None:
        self.work, self.app, self.bundles, self.env = work, app, bundles, env
        self.figures: dict[str, dict] = {}

    def sh(self, *cmd: str, cwd: Path | None = None, check: bool = True, timeout: float = 1800):
        done = subprocess.run(
            list(cmd), cwd=cwd or self.app, env=self.env, capture_output=True, text=True, timeout=timeout, check=False
        )
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} -> {done.returncode}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
        return done

    def compose(self, host: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return self.sh("docker", "compose", "-p", f"{PREFIX}-{host}", *args, cwd=self.bundles / host, check=check)

    def container(self, host: str, service: str) -> str:
        (cid,) = self.compose(host, "ps", "-a", "-q", service).stdout.split()
        return cid

    def logs(self, host: str, service: str, since: float | None = None) -> str:
        extra = ["--since", f"{since:.3f}"] if since is not None else []
        return self.compose(host, "logs", "--no-color", *extra, service, check=False).stdout

    def run_dir(self, name: str) -> Path:
        return self.bundles / "server" / "outputs" / name

    def run(self, name: str, rounds: int, fault: Callable[[], None] | None = None, after_round: int = 1, extra=""):
        """Start a run, call ``fault`` once round ``after_round`` is recorded, wait for the end; (exit, output).
        The CLI's output goes to a file: a fault may take minutes, and a full pipe would stall the run."""
        config = f"run-name='{name}' num-server-rounds={rounds} round-timeout=240.0 {extra}".strip()
        cmd = [sys.executable, "-m", "fedvit.app.cli", "run", ".", CONNECTION, "-c", config]
        log = self.work / f"{name}-{time.monotonic_ns()}.log"
        with open(log, "w") as out:
            proc = subprocess.Popen(cmd, cwd=self.app, env=self.env, stdout=out, stderr=subprocess.STDOUT, text=True)
            self.current = (proc, log)
            try:
                if fault is not None:
                    self.wait_for_round(name, after_round)
                    fault()
                proc.wait(timeout=RUN_TIMEOUT_S)
            finally:
                if proc.poll() is None:
                    proc.kill()
        return proc.returncode, log.read_text()

    def wait_for_round(self, name: str, rnd: int) -> float:
        """Block until round ``rnd`` of the current run is in metrics.json; returns when (time.time())."""
        proc, log = self.current
        deadline = time.monotonic() + RUN_TIMEOUT_S
        path = self.run_dir(name) / "metrics.json"
        while not (path.exists() and rnd in metrics(self.run_dir(name))):
            if proc.poll() is not None:
                raise AssertionError(f"the run ended before round {rnd}:\n{log.read_text()[-6000:]}")
            assert time.monotonic() < deadline, f"round {rnd} of {name} did not finish"
            time.sleep(0.5)
        return time.time()


@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    installed = install_missing()
    work = tmp_path_factory.mktemp("multihost")
    env = compose_env(work / "docker-config") | {
        "FLWR_HOME": str(work / "flwr-home"),
        "FLWR_TELEMETRY_ENABLED": "0",
        "FLWR_DISABLE_UPDATE_CHECK": "1",
    }
    env.pop("COMPOSE_PROJECT_NAME", None)
    root = Path(tempfile.mkdtemp(prefix="fedvit-multihost-"))  # outside pytest's 0700 temp root (user 49999)
    root.chmod(0o755)
    app, bundles = root / "app", root / "hosts"
    app.mkdir()
    copy_app(app)
    with docker_engine(work):
        fed = Federation(work, app, bundles, env)
        started = time.perf_counter()
        try:
            assert port_free(SUPERLINK_PORT), f"port {SUPERLINK_PORT} is taken; the server bundle publishes it"
            fed.sh(sys.executable, "-m", "fedvit.app.cli", "deploy", "base-images")
            address = bridge_address()
            creds = root / "admin-credentials"  # stays with the admin: the CA key is in no bundle
            fed.sh(sys.executable, "-m", "fedvit.app.cli", "deploy", "credentials", str(creds),
                   "--supernodes", str(CLIENTS), "--superlink-name", address)  # fmt: skip
            fed.sh(sys.executable, "-m", "fedvit.app.cli", "deploy", "bundle", str(bundles), "--credentials",
                   str(creds), "--supernodes", str(CLIENTS), "--superlink-address", f"{address}:{SUPERLINK_PORT}",
                   "--source", str(app))  # fmt: skip
            for path in [bundles, *bundles.rglob("*")]:  # each bundle README's one root step
                os.chown(path, APP_UID, APP_UID)
            for host in ["server"] + [f"client-{i}" for i in range(1, CLIENTS + 1)]:  # an earlier run's leftovers
                fed.compose(host, "down", "-v", "--remove-orphans", check=False)
            fed.compose("server", "build")
            fed.compose("server", "up", "-d")
            fed.sh(sys.executable, "-m", "fedvit.app.cli", "deploy", "register", "--connection", CONNECTION,
                   "--credentials", str(bundles / "server" / "credentials"), "--supernodes", str(CLIENTS),
                   "--address", f"127.0.0.1:{SUPERLINK_PORT}")  # fmt: skip
            for i in range(1, CLIENTS + 1):
                fed.compose(f"client-{i}", "up", "-d")
            fed.figures["bring-up"] = {"seconds": round(time.perf_counter() - started, 1), "installed": installed}
            yield fed
        except Exception:
            print(fed.logs("server", "superlink")[-3000:])
            raise
        finally:
            for host in ["server"] + [f"client-{i}" for i in range(1, CLIENTS + 1)]:
                if (bundles / host).is_dir():
                    fed.compose(host, "down", "-v", "--remove-orphans", check=False)
            FIGURES_FILE.parent.mkdir(parents=True, exist_ok=True)
            FIGURES_FILE.write_text(json.dumps(fed.figures, indent=1) + "\n")
            print("\nmulti-host figures: " + json.dumps(fed.figures))
            shutil.rmtree(root, ignore_errors=True)


def networks(fed: Federation, host: str, service: str) -> set[str]:
    cid = fed.container(host, service)
    out = fed.sh("docker", "inspect", "-f", "{{range $k, $v := .NetworkSettings.Networks}}{{$k}} {{end}}", cid)
    return set(out.stdout.split())


def model(fed: Federation, name: str) -> dict[str, np.ndarray]:
    return load_file(str(fed.run_dir(name) / "model.safetensors"))


def test_bundles_hold_only_their_own_secrets_and_run_on_their_own_networks(federation):
    assert check_bundles(federation.bundles) == []
    assert networks(federation, "server", "superlink") == {f"{PREFIX}-server_default"}
    for i in range(1, CLIENTS + 1):
        assert networks(federation, f"client-{i}", f"supernode-{i}") == {f"{PREFIX}-client-{i}_default"}


def test_two_rounds_across_hosts(federation):
    start = time.perf_counter()
    code, output = federation.run("mh-plain", rounds=2, extra=BIT_EQUAL)
    assert code == 0 and "finished:completed" in output, output[-6000:]
    rounds = metrics(federation.run_dir("mh-plain"))
    for rnd in (1, 2):
        assert sorted(rounds[rnd]["sampled"]) == list(range(CLIENTS)) and rounds[rnd]["rejected"] == {}
    federation.figures["2 rounds"] = {"seconds": round(time.perf_counter() - start, 1)}


def figures_of_rounds(rounds: dict[int, dict], partition: int, fault_round: int) -> dict:
    """Rounds from ``fault_round`` on in which ``partition`` did not train, and the first in which it did again."""
    trained = [r for r in sorted(rounds) if r >= fault_round and partition in rounds[r]["sampled"]
               and str(partition) not in rounds[r]["rejected"]]  # fmt: skip
    back = trained[0] if trained else None
    lost = [r for r in sorted(rounds) if r >= fault_round and (back is None or r < back)]
    return {"rounds lost": lost, "trained again in round": back}


def logged_after(fed: Federation, host: str, service: str, marker: str, since: float) -> float | None:
    """Seconds after ``since`` at which ``service`` of ``host`` next logged ``marker``, from its timestamped log."""
    out = fed.compose(host, "logs", "-t", "--no-color", "--since", f"{since:.3f}", service, check=False).stdout
    for line in out.splitlines():
        if marker in line:
            stamp = line.split("|", 1)[1].split()[0] if "|" in line else line.split()[0]
            when = datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
            return round(when - since, 1)
    return None


def test_client_host_dies_and_rejoins_within_the_run(federation):
    """Client host 3 is killed in round 2 (both containers, as a power cut) and comes back 15 s later: round 2
    aggregates the others; the SuperNode retries the refused activation until the SuperLink counts the old session
    offline, and round 3, which waits for all clients, trains it again."""
    fed, host, partition = federation, "client-3", 2
    when: dict[str, float] = {}

    def power_cut() -> None:
        when["down"] = time.time()
        fed.compose(host, "kill")
        time.sleep(15)
        when["back"] = time.time()
        fed.compose(host, "up", "-d")

    code, output = fed.run("mh-rejoin", rounds=4, fault=power_cut, extra=ALL_CLIENTS)
    assert code == 0 and "finished:completed" in output, output[-6000:]
    rounds = metrics(fed.run_dir("mh-rejoin"))
    figures = figures_of_rounds(rounds, partition, fault_round=2)
    figures["activated s after coming back"] = logged_after(
        fed, "server", "superlink", "Activated node_id", when["back"]
    )
    figures["round 2 s"] = round(rounds[2]["round-s"], 1)
    fed.figures["client host dies in round 2, back after 15 s"] = figures
    print(figures)
    assert figures["trained again in round"] is not None, rounds
    assert all(rounds[r]["num-examples"] > 0 for r in rounds if r >= 1)  # every round aggregated someone


def test_client_host_loses_the_network_for_a_round(federation):
    """Client host 2's SuperNode is cut from its network in round 2 and reconnected when round 2 ends: round 2
    aggregates the others; the SuperNode keeps its session, its retries get through, and round 3, which waits for
    all clients, trains it again."""
    fed, host, partition = federation, "client-2", 1
    network = f"{PREFIX}-{host}_default"
    when: dict[str, float] = {}

    def cut() -> None:
        cid = fed.container(host, "supernode-2")
        when["cut"] = time.time()
        fed.sh("docker", "network", "disconnect", network, cid)
        when["round 2 done"] = fed.wait_for_round("mh-netcut", 2)
        fed.sh("docker", "network", "connect", "--alias", "supernode-2", network, cid)
        when["reconnected"] = time.time()

    code, output = fed.run("mh-netcut", rounds=4, fault=cut, extra=ALL_CLIENTS)
    assert code == 0 and "finished:completed" in output, output[-6000:]
    rounds = metrics(fed.run_dir("mh-netcut"))
    assert rounds[2]["num-examples"] > 0  # the others were aggregated
    assert partition not in rounds[2]["sampled"] or str(partition) in rounds[2]["rejected"]
    figures = figures_of_rounds(rounds, partition, fault_round=2)
    figures["round 2 s (waiting for the cut client)"] = round(when["round 2 done"] - when["cut"], 1)
    figures["reconnected s after the network came back"] = logged_after(
        fed, host, "supernode-2", "Connection successful after", when["reconnected"]
    )
    fed.figures["client host cut from the network for round 2"] = figures
    print(figures)
    assert figures["trained again in round"] is not None, (rounds, fed.logs(host, "supernode-2", when["cut"])[-6000:])


def test_superlink_restart_mid_run_then_resume_is_bit_equal(federation):
    """The policy for a round that loses clients to a SuperLink restart (docs/deploy.md): with
    accept-failures=false it is never aggregated. Whether the SuperNodes' replies get through the restart is a race
    (some, all or none of them), so the test asserts the policy on both outcomes: either the run completed and
    every round aggregated all three clients, or it stopped at a round short of a client, naming it, and the resume
    redoes that round with all three. Either way the model is bit-equal to the uninterrupted run."""
    fed = federation
    when: dict[str, float] = {}

    def restart() -> None:
        when["restart"] = time.time()
        fed.compose("server", "restart", "superlink")

    code, output = fed.run("mh-superlink", rounds=2, fault=restart, extra=BIT_EQUAL)
    figures: dict = {"exit": code, "status": status_line(output)}
    if code != 0:  # a round lost clients: not aggregated, the run stopped before it; resume from the checkpoint
        # The reason is in fedvit run's output: streamed, or printed from the SuperLink's log when the restart cut
        # the stream first (cli.print_missed_log); the ServerApp container's own log is shown when it is not.
        stated = "accept-failures=false" in output or "clients failed" in output
        serverapp_log = "" if stated else fed.logs("server", "superexec-serverapp", when["restart"])[-6000:]
        assert stated, f"{output[-6000:]}\n---- the ServerApp executor's log since the restart ----\n{serverapp_log}"
        assert 2 not in metrics(fed.run_dir("mh-superlink")), "the short round was recorded"
        start = time.perf_counter()
        code, output = fed.run("mh-superlink", rounds=2, extra=f"resume-from='outputs/mh-superlink' {BIT_EQUAL}")
        figures["resume s"] = round(time.perf_counter() - start, 1)
        assert code == 0 and "finished:completed" in output, output[-6000:]
    fed.figures["SuperLink restarted after round 1"] = figures
    print(figures, output[-3000:])
    trained = {r: entry for r, entry in metrics(fed.run_dir("mh-superlink")).items() if r >= 1}  # 0: the start
    assert sorted(trained) == [1, 2]
    assert all(sorted(entry["aggregated"]) == list(range(CLIENTS)) for entry in trained.values()), trained
    compare_models(model(fed, "mh-superlink"), model(fed, "mh-plain"))


def test_serverapp_executor_crash_fails_the_run_and_resume_is_bit_equal(federation):
    fed = federation

    def crash() -> None:
        cid = fed.container("server", "superexec-serverapp")
        pid = fed.sh("docker", "inspect", "-f", "{{.State.Pid}}", cid).stdout.strip()
        os.kill(int(pid), 9)

    start = time.perf_counter()
    code, output = fed.run("mh-executor", rounds=2, fault=crash, extra=BIT_EQUAL)
    figures = {
        "exit": code,
        "status": status_line(output),
        "until the CLI returned s": round(time.perf_counter() - start, 1),
    }
    assert code != 0, output[-6000:]
    start = time.perf_counter()
    code, output = fed.run("mh-executor", rounds=2, extra=f"resume-from='outputs/mh-executor' {BIT_EQUAL}")
    figures["resume s"] = round(time.perf_counter() - start, 1)
    fed.figures["ServerApp executor SIGKILLed after round 1"] = figures
    print(figures)
    assert code == 0 and "finished:completed" in output, output[-6000:]
    compare_models(model(fed, "mh-executor"), model(fed, "mh-plain"))


def status_line(output: str) -> str:
    lines = [line for line in output.splitlines() if "finished:" in line or "Error" in line or "error" in line]
    return lines[-1].strip()[-300:] if lines else output.strip().splitlines()[-1][-300:]


def compare_models(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert got.keys() == want.keys()
    differ = [k for k in want if not np.array_equal(got[k], want[k])]
    assert not differ, f"{len(differ)} tensors differ from the uninterrupted run, e.g. {differ[:3]}"
