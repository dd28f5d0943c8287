"""The deployment topology, defined once: every process, its command line and what it may read.

Both ``docker-compose.yml`` (:mod:`fedvit.app.deployment.compose`) and the loopback deployment
(:mod:`fedvit.app.deployment.loopback`) are built from :func:`processes`, so the flags a container gets are the
flags the CI-tested loopback processes get; only addresses and file paths differ (a :class:`Layout`).

Layout (Flower 1.41, process isolation): one SuperLink (Fleet, Control and Runtime API on one HTTPS port),
one SuperExec for the ServerApp, N SuperNodes (each with its own Runtime API port) and one SuperExec per
SuperNode that runs the ClientApp (``fedvit-superexec``: Flower's SuperExec forking each task from a warm
parent). TLS everywhere, SuperNode authentication on, runtime dependency
installation off, SuperLink state in a database file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import PurePath

from fedvit.app.deployment.warm_superexec import DEFAULT_PULL_BACKOFF_S, PULL_BACKOFF_ENV
from fedvit.app.polling_grid import DEFAULT_POLL_S, POLL_ENV

FLWR_VERSION = "1.41.0"
SUPERLINK_PORT = 8000  # Flower 1.41 default: one HTTP(S) port for every SuperLink API
SUPERNODE_PORT = 9094  # Flower 1.41 default for a SuperNode's Runtime API
# Poll intervals that Flower 1.41 lets one set from outside (docs/deploy.md, "Round latency"); the environment wins.
SUPEREXEC_POLL = {"FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.1"}  # SuperExec asking for a task (Flower: 1 s)
# fedvit's ServerApp pulling replies (Flower's HttpGrid: 3 s); listed so compose passes a host override through.
SERVERAPP_POLL = {POLL_ENV: str(DEFAULT_POLL_S)}
# A forked ClientApp task's retry while its message reaches the SuperNode (fedvit-superexec; Flower: 1 s to 10 s).
PULL_BACKOFF = {name: str(DEFAULT_PULL_BACKOFF_S[key]) for key, name in PULL_BACKOFF_ENV.items()}


@dataclass(frozen=True)
class Layout:
    """Where things are for one way of running the topology (containers, or processes on 127.0.0.1)."""

    num_supernodes: int
    superlink_host: str  # name the others dial
    supernode_hosts: list[str]
    bind_host: str  # interface every server listens on
    superlink_port: int
    supernode_ports: list[int]
    credentials: PurePath  # folder with the files written by ``fedvit deploy credentials``
    state_db: PurePath

    def __post_init__(self) -> None:
        if self.num_supernodes < 1:
            raise ValueError(f"num_supernodes must be >= 1, got {self.num_supernodes}")
        if not len(self.supernode_hosts) == len(self.supernode_ports) == self.num_supernodes:
            raise ValueError("one host and one port per SuperNode")

    @property
    def superlink_address(self) -> str:
        return f"{self.superlink_host}:{self.superlink_port}"

    def supernode_address(self, index: int) -> str:
        return f"{self.supernode_hosts[index]}:{self.supernode_ports[index]}"


@dataclass(frozen=True)
class Process:
    """One long-running Flower process: its role, argv (program first) and the credential files it reads."""

    name: str  # compose service name
    role: str  # superlink | superexec-serverapp | supernode | superexec-clientapp
    argv: list[str]
    credentials: list[str] = field(default_factory=list)  # file names inside Layout.credentials
    partition_id: int | None = None
    env: dict[str, str] = field(default_factory=dict)  # environment defaults (a value set by the user wins)

    @property
    def program(self) -> str:
        return self.argv[0]


def credential_names(num_supernodes: int) -> dict[str, list[str]]:
    """Which credential files each kind of process needs (none of them holds another's private key)."""
    names = {
        "superlink": ["ca.crt", "superlink.crt", "superlink.key"],
        "superexec-serverapp": ["ca.crt"],
    }
    for i in range(num_supernodes):
        node = supernode_name(i)
        names[node] = ["ca.crt", f"{node}.crt", f"{node}.key", f"{node}.auth"]
        names[f"superexec-clientapp-{i + 1}"] = ["ca.crt"]
    return names


def supernode_name(index: int) -> str:
    return f"supernode-{index + 1}"


def processes(layout: Layout, warm_executor: bool = True) -> list[Process]:
    """Every process of the deployment, in start order. ``warm_executor=False`` runs the ClientApp executors as
    Flower's plain ``flower-superexec`` (a fresh interpreter per message; for comparison)."""
    cred = layout.credentials
    needs = credential_names(layout.num_supernodes)
    out = [
        Process(
            "superlink",
            "superlink",
            [
                "flower-superlink",
                "--ssl-ca-certfile", str(cred / "ca.crt"),
                "--ssl-certfile", str(cred / "superlink.crt"),
                "--ssl-keyfile", str(cred / "superlink.key"),
                "--enable-supernode-auth",
                "--isolation", "process",
                "--host", layout.bind_host,
                "--port", str(layout.superlink_port),
                "--database", str(layout.state_db),
                "--disable-runtime-dependency-installation",
            ],
            needs["superlink"],
        ),
        Process(
            "superexec-serverapp",
            "superexec-serverapp",
            [
                "flower-superexec",
                "--runtime-api-address", layout.superlink_address,
                "--root-certificates", str(cred / "ca.crt"),
            ],
            needs["superexec-serverapp"],
            env=SUPEREXEC_POLL | SERVERAPP_POLL,
        ),
    ]  # fmt: skip
    for i in range(layout.num_supernodes):
        node = supernode_name(i)
        out.append(
            Process(
                node,
                "supernode",
                [
                    "flower-supernode",
                    "--superlink", layout.superlink_address,
                    "--root-certificates", str(cred / "ca.crt"),
                    "--auth-supernode-private-key", str(cred / f"{node}.auth"),
                    "--node-config", f"partition-id={i} num-partitions={layout.num_supernodes}",
                    "--isolation", "process",
                    "--host", layout.bind_host,
                    "--port", str(layout.supernode_ports[i]),
                    "--ssl-certfile", str(cred / f"{node}.crt"),
                    "--ssl-keyfile", str(cred / f"{node}.key"),
                    "--ssl-ca-certfile", str(cred / "ca.crt"),
                ],
                needs[node],
                partition_id=i,
            )
        )  # fmt: skip
        out.append(
            Process(
                f"superexec-clientapp-{i + 1}",
                "superexec-clientapp",
                [
                    # flower-superexec with a warm executor that forks each ClientApp task
                    "fedvit-superexec" if warm_executor else "flower-superexec",
                    "--runtime-api-address", layout.supernode_address(i),
                    "--root-certificates", str(cred / "ca.crt"),
                ],
                needs[f"superexec-clientapp-{i + 1}"],
                partition_id=i,
                env=SUPEREXEC_POLL | (PULL_BACKOFF if warm_executor else {}),
            )
        )  # fmt: skip
    return out
