"""The deployment topology as real processes on 127.0.0.1 (``fedvit deploy loopback``, and the CI test).

Same processes and flags as ``docker-compose.yml`` (both come from :func:`topology.processes`); only the
addresses (free local ports) and the credential paths differ. Every process runs in its own session with its
log in ``<workdir>/logs``; :meth:`LoopbackDeployment.stop` ends all of them, also when the run failed.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from fedvit.app.deployment.connection import add_connection
from fedvit.app.deployment.credentials import register_command, write_credentials
from fedvit.app.deployment.topology import Layout, Process, processes
from fedvit.app.flower_processes import executable, flower_env, free_ports

CONNECTION = "fedvit-loopback"
READY_TIMEOUT_S = 60.0


class DeploymentError(RuntimeError):
    """A deployment process failed to start, or a CLI step failed."""


def wait_for_port(port: int, proc: subprocess.Popen, log: Path, timeout: float = READY_TIMEOUT_S) -> None:
    """Block until something listens on 127.0.0.1:``port``; fail early if ``proc`` exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise DeploymentError(f"exited with code {proc.returncode} before listening; see {log}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise DeploymentError(f"nothing listens on port {port} after {timeout:.0f} s; see {log}")


class LoopbackDeployment:
    """SuperLink, ServerApp SuperExec, N SuperNodes and their ClientApp SuperExecs on 127.0.0.1, TLS and
    SuperNode authentication on. Use as a context manager; :meth:`run` starts ``flwr run`` against it."""

    def __init__(
        self,
        workdir: Path,
        num_supernodes: int = 3,
        client_env: dict[str, str] | None = None,
        warm_executor: bool = True,
    ) -> None:
        self.workdir = workdir.resolve()
        self.warm_executor = warm_executor
        ports = free_ports(num_supernodes + 1)
        self.layout = Layout(
            num_supernodes=num_supernodes,
            superlink_host="127.0.0.1",
            supernode_hosts=["127.0.0.1"] * num_supernodes,
            bind_host="127.0.0.1",
            superlink_port=ports[0],
            supernode_ports=ports[1:],
            credentials=self.workdir / "credentials",
            state_db=self.workdir / "superlink" / "state.db",
        )
        # One torch thread per ClientApp process by default: N clients share this machine's cores.
        self.client_env = {"OMP_NUM_THREADS": "1"} | (client_env or {})
        self.cli_home = self.workdir / "flwr-cli"
        self.logs = self.workdir / "logs"
        self.procs: dict[str, subprocess.Popen] = {}

    # ------------------------------------------------------------------ environment

    def base_env(self, home: Path) -> dict[str, str]:
        """The caller's environment with Flower's safe defaults and this environment's bin on PATH (executors
        start flwr-serverapp / flwr-clientapp by name), and ``home`` as FLWR_HOME."""
        return flower_env() | {"FLWR_HOME": str(home), "FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1"}

    def cli_env(self) -> dict[str, str]:
        """Environment for ``flwr``/``fedvit`` CLI calls against this deployment."""
        return self.base_env(self.cli_home) | {"FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1"}

    def process_env(self, process: Process) -> dict[str, str]:
        env = process.env | self.base_env(self.workdir / "homes" / process.name)  # the caller's environment wins
        if process.role == "superexec-clientapp":
            env |= {"FEDVIT_CLIENT_STATE": str(self.workdir / "client-state" / process.name)} | self.client_env
        return env

    # ------------------------------------------------------------------ life cycle

    def start(self) -> None:
        """Credentials, SuperLink + its executor, key registration, then SuperNodes + executors."""
        self.logs.mkdir(parents=True, exist_ok=True)
        self.layout.state_db.parent.mkdir(parents=True, exist_ok=True)
        write_credentials(self.layout.credentials, self.layout.num_supernodes)
        add_connection(self.cli_home, CONNECTION, self.layout.superlink_address, self.layout.credentials / "ca.crt")
        plan = processes(self.layout, self.warm_executor)
        superlink = self.spawn(plan[0])
        wait_for_port(self.layout.superlink_port, superlink, self.log_of(plan[0].name))
        self.spawn(plan[1])
        for i in range(self.layout.num_supernodes):
            self.cli(register_command(executable("flwr"), self.layout.credentials, i, CONNECTION))
        for process in plan[2:]:
            proc = self.spawn(process)
            if process.role == "supernode":
                wait_for_port(self.layout.supernode_ports[process.partition_id], proc, self.log_of(process.name))

    def log_of(self, name: str) -> Path:
        return self.logs / f"{name}.log"

    def spawn(self, process: Process, argv: list[str] | None = None, name: str | None = None) -> subprocess.Popen:
        """Start one process in its own session (so its children die with it), logging to a file."""
        name = name or process.name
        argv = argv or process.argv
        with open(self.log_of(name), "ab") as log:
            proc = subprocess.Popen(
                [executable(argv[0]), *argv[1:]],
                env=self.process_env(process),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.procs[name] = proc
        return proc

    def cli(self, argv: list[str], timeout: float = 120.0) -> subprocess.CompletedProcess:
        """Run a CLI step; raise with its output when it fails."""
        done = subprocess.run(argv, env=self.cli_env(), capture_output=True, text=True, timeout=timeout, check=False)
        if done.returncode != 0:
            raise DeploymentError(f"{' '.join(argv[:4])}... failed ({done.returncode}): {done.stdout}{done.stderr}")
        return done

    def run(
        self, app_dir: Path, overrides: list[str], timeout: float = 900.0, stream: bool = False
    ) -> subprocess.CompletedProcess:
        """``fedvit run <app> fedvit-loopback -c ...``; exit code = the run's final status. The output is
        returned (or, with ``stream``, printed as it comes)."""
        argv = [sys.executable, "-m", "fedvit.app.cli", "run", str(app_dir), CONNECTION]
        for override in overrides:
            argv += ["-c", override]
        return subprocess.run(
            argv, env=self.cli_env(), capture_output=not stream, text=True, timeout=timeout, check=False, cwd=app_dir
        )

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Kill one process (e.g. a SuperNode, to test faults); its executor keeps running, as a crash would."""
        proc = self.procs[name]
        os.kill(proc.pid, sig)
        proc.wait(timeout=30)

    def stop(self, grace_s: float = 10.0) -> None:
        """End every started process (and its children): SIGTERM, then SIGKILL after ``grace_s``."""
        for proc in self.procs.values():
            if proc.poll() is None:
                _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            _signal_group(proc, signal.SIGKILL)  # also reaps stray children (flwr-clientapp, flwr-serverapp)
            proc.wait()

    def __enter__(self) -> LoopbackDeployment:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass
