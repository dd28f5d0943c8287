"""Per-host deployment bundles (``fedvit deploy bundle``): one folder for the server host, one per client host.

Each bundle is what one machine needs and nothing more: its compose file (a separate compose project with its
own network), the credential files :func:`topology.credential_names` lists for its processes, a ``.env`` and a
README with that host's commands. The server bundle also carries every SuperNode's *public* authentication key
(to register them); the clients' encryption key goes to client bundles only; the CA's private key goes nowhere.
:func:`check_bundles` reads every file of every bundle and names any private material that is not the bundle's own.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from fedvit.app.deployment.compose import HEADER, HostPaths, compose_document, compose_layout, to_yaml
from fedvit.app.deployment.credentials import CredentialsError, write_file
from fedvit.app.deployment.topology import Process, credential_names, processes, supernode_name

SERVER = "server"
KEY_FILE = "encryption-key.safetensors"
ENCRYPTION_KEY_FORMAT = "fedvit-encryption-key/1"  # = fedvit.clients.encryption.KEY_FORMAT (no import)
SUPERVISOR_FILE = "supernode_supervisor.py"
BUNDLE_PATHS = HostPaths(
    credentials="./credentials",
    superlink_state="./state",
    keys="./keys",
    source="${FEDVIT_SOURCE:?set FEDVIT_SOURCE in .env}",
    supervisor=f"./{SUPERVISOR_FILE}",
)
# What the client compose files dial: set per host in its .env, so a bundle moves without being re-rendered.
ADDRESS_VARIABLE = "${SUPERLINK_ADDRESS:?set SUPERLINK_ADDRESS in .env}"
PRIVATE_BLOCK = re.compile(rb"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?-----END [A-Z ]*PRIVATE KEY-----\s*", re.S)


class BundleError(RuntimeError):
    """Bundles cannot be written (missing credentials, a certificate without the SuperLink's name, ...)."""


def client_name(index: int) -> str:
    return f"client-{index + 1}"


def host_processes(plan: list[Process], host: str) -> list[Process]:
    """The processes that run on ``host``: the SuperLink and ServerApp executor, or one client's pair."""
    if host == SERVER:
        return [p for p in plan if p.partition_id is None]
    return [p for p in plan if p.partition_id is not None and client_name(p.partition_id) == host]


def host_credentials(host: str, num_supernodes: int) -> list[str]:
    """Credential files a host's bundle holds (the server's includes every SuperNode's public auth key)."""
    needs = credential_names(num_supernodes)
    plan = processes(compose_layout(num_supernodes))
    files = sorted({name for p in host_processes(plan, host) for name in needs[p.name]})
    if host == SERVER:
        files += [f"{supernode_name(i)}.auth.pub" for i in range(num_supernodes)]
    return files


def _compose_document(host: str, num_supernodes: int, superlink_address: str) -> dict:
    # On the server host the ServerApp executor dials the SuperLink on their own network; clients dial the address.
    layout = compose_layout(num_supernodes)
    plan = host_processes(processes(layout), host)
    document = compose_document(f"fedvit-{host}", plan, layout, BUNDLE_PATHS)
    published = superlink_address.rpartition(":")[2]
    for p in plan:
        spec = document["services"][p.name]
        if p.role == "supernode":
            del spec["depends_on"]  # the SuperLink is on another host
            spec["command"][spec["command"].index("--superlink") + 1] = ADDRESS_VARIABLE
        if p.role == "superlink":
            spec["ports"] = [f"${{SUPERLINK_PORT:-{published}}}:{layout.superlink_port}"]
    return document


def _sans(certificate: Path) -> list[str]:
    cert = x509.load_pem_x509_certificate(certificate.read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return [str(n) for n in names.get_values_for_type(x509.DNSName)] + [
        str(n) for n in names.get_values_for_type(x509.IPAddress)
    ]


@dataclass(frozen=True)
class BundleSpec:
    num_supernodes: int
    superlink_address: str  # host:port the client hosts dial
    source: str  # path of a fedvit checkout on each host (build context of the SuperExec image)


def _readme(host: str, spec: BundleSpec) -> str:
    host_name, _, port = spec.superlink_address.rpartition(":")
    common = (
        "The containers run as Flower's user 49999: once, as root, `chown -R 49999:49999 .` in this folder\n"
        "(the private keys are 0600 and compose mounts them with their host owner).\n"
        "`FEDVIT_SOURCE` in `.env` is a fedvit checkout on this machine: `docker compose build` builds the\n"
        "SuperExec image from it (or `docker load` an image built elsewhere and skip the build).\n"
    )
    if host == SERVER:
        return (
            f"# fedvit server host ({host_name})\n\n"
            "SuperLink (Fleet, Control and Runtime API on one TLS port) and the ServerApp executor.\n"
            f"Open TCP port {port} to the client hosts and to the machine that runs `flwr`.\n\n"
            f"{common}\n"
            "```bash\n"
            "docker compose build && docker compose up -d\n"
            "# from wherever the flwr CLI runs, with this folder's credentials/ (public keys and ca.crt only):\n"
            f"fedvit deploy register --credentials credentials --supernodes {spec.num_supernodes} "
            f"--address {spec.superlink_address}\n"
            "fedvit run <app> fedvit-docker\n"
            "```\n\n"
            "Holds: ca.crt, the SuperLink's TLS certificate and key, every SuperNode's public authentication key.\n"
            "Never holds: the CA's private key, a SuperNode's private key, the clients' encryption key.\n"
        )
    return (
        f"# fedvit client host: {host}\n\n"
        f"Its SuperNode and ClientApp executor. It dials the SuperLink at `SUPERLINK_ADDRESS` (`.env`, now\n"
        f"{spec.superlink_address}); nothing needs to reach this host from outside.\n\n"
        f"{common}\n"
        "```bash\n"
        "docker compose build && docker compose up -d\n"
        "docker compose logs -f   # 'SuperNode ID: ...' once the server side has registered this node's key\n"
        "```\n\n"
        "Holds: ca.crt, this SuperNode's TLS certificate and key, its authentication key and, for encrypted\n"
        "runs, the clients' shared encryption key (keys/). Never holds another host's private material.\n"
    )


def write_bundles(
    out: Path,
    credentials: Path,
    num_supernodes: int,
    superlink_address: str,
    encryption_key: Path | None = None,
    source: Path | None = None,
    force: bool = False,
) -> list[Path]:
    """Write ``out/server`` and ``out/client-i`` (i = 1..N); returns the bundle folders."""
    host_name, _, port = superlink_address.rpartition(":")
    if not host_name or not port.isdigit():
        raise BundleError(f"--superlink-address must be host:port, got {superlink_address!r}")
    certificate = credentials / "superlink.crt"
    if not certificate.is_file():
        raise CredentialsError(f"{certificate} is missing; run `fedvit deploy credentials {credentials}` first")
    if host_name not in _sans(certificate):
        raise BundleError(
            f"the SuperLink's certificate does not name {host_name!r} (it names {', '.join(_sans(certificate))}); "
            f"write credentials with `--superlink-name {host_name}`"
        )
    if encryption_key is not None and not encryption_key.is_file():
        raise BundleError(f"encryption key {encryption_key} not found (`fedvit keygen` writes one)")
    spec = BundleSpec(num_supernodes, superlink_address, str((source or Path.cwd()).resolve()))
    hosts = [SERVER] + [client_name(i) for i in range(num_supernodes)]
    taken = [out / h for h in hosts if (out / h).exists()]
    if taken and not force:
        raise BundleError(f"{taken[0]} exists; pass --force to replace the bundles")
    folders = []
    for host in hosts:
        folder = out / host
        if folder.exists():
            shutil.rmtree(folder)
        (folder / "credentials").mkdir(parents=True)
        for name in host_credentials(host, num_supernodes):
            source_file = credentials / name
            if not source_file.is_file():
                raise CredentialsError(
                    f"{source_file} is missing; were credentials written for {num_supernodes} SuperNodes?"
                )
            write_file(
                folder / "credentials" / name, source_file.read_bytes(), private=name.endswith((".key", ".auth"))
            )
        writable = ["outputs", "data"] + (["state"] if host == SERVER else ["keys"])
        for name in writable:
            (folder / name).mkdir()
        if host != SERVER:  # the SuperNode's entrypoint (see supernode_supervisor.py)
            shutil.copyfile(Path(__file__).with_name(SUPERVISOR_FILE), folder / SUPERVISOR_FILE)
        if encryption_key is not None and host != SERVER:
            write_file(folder / "keys" / KEY_FILE, encryption_key.read_bytes(), private=True)
        document = _compose_document(host, num_supernodes, superlink_address)
        (folder / "docker-compose.yml").write_text(to_yaml(document).replace(HEADER, _bundle_header(host)))
        env = [f"FEDVIT_SOURCE={spec.source}"]
        env += [f"SUPERLINK_PORT={port}"] if host == SERVER else [f"SUPERLINK_ADDRESS={superlink_address}"]
        (folder / ".env").write_text("\n".join(env) + "\n")
        (folder / "README.md").write_text(_readme(host, spec))
        folders.append(folder)
    problems = check_bundles(out)
    if problems:  # cannot happen unless the credentials folder itself is mixed up; never leave such bundles
        raise BundleError("refusing the bundles: " + "; ".join(problems))
    return folders


def _bundle_header(host: str) -> str:
    return (
        f"# fedvit deployment bundle for host '{host}', generated by `fedvit deploy bundle` from\n"
        "# fedvit.app.deployment.topology (the flags the loopback and compose tests run).\n"
        "# This host's commands: README.md beside this file.\n"
    )


# ---- the secrets check ----------------------------------------------------------------------------------------


def _openssh(public_key) -> bytes:
    """A public key as OpenSSH writes it without a comment: one form for certificates, auth keys, private keys."""
    return public_key.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)


def _identities(out: Path) -> dict[bytes, str]:
    """Public key (OpenSSH bytes) -> whose it is, read from every bundle's certificates and public auth keys."""
    owners: dict[bytes, str] = {}
    for path in sorted(out.glob("*/credentials/*")):
        if path.suffix == ".crt":
            public = x509.load_pem_x509_certificate(path.read_bytes()).public_key()
            owners[_openssh(public)] = "the CA" if path.name == "ca.crt" else path.stem
        elif path.name.endswith(".auth.pub"):
            public = serialization.load_ssh_public_key(path.read_bytes())
            owners[_openssh(public)] = path.name.removesuffix(".auth.pub") + " (auth)"
    return owners


def _own_identities(host: str) -> set[str]:
    if host == SERVER:
        return {"superlink"}
    node = supernode_name(int(host.removeprefix("client-")) - 1)
    return {node, f"{node} (auth)"}


def _load_private(block: bytes):
    if b"OPENSSH PRIVATE KEY" in block:
        return serialization.load_ssh_private_key(block, password=None)
    return serialization.load_pem_private_key(block, password=None)


def _is_encryption_key(path: Path) -> bool:
    from safetensors import safe_open

    try:
        with safe_open(str(path), "np") as f:
            return (f.metadata() or {}).get("format") == ENCRYPTION_KEY_FORMAT
    except Exception:  # noqa: BLE001 (not a safetensors file: nothing to say about it)
        return False


def check_bundles(out: Path) -> list[str]:
    """Every private key or secret in a bundle that is not that host's own, one line each ([] when clean)."""
    owners = _identities(out)
    problems = []
    for folder in sorted(p for p in out.iterdir() if p.is_dir()):
        host = folder.name
        own = _own_identities(host) if host == SERVER or host.startswith("client-") else set()
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            where = path.relative_to(out)
            if _is_encryption_key(path) and host == SERVER:
                problems.append(f"{where}: the clients' encryption key is in the server's bundle")
            for block in PRIVATE_BLOCK.findall(path.read_bytes()):
                try:
                    owner = owners.get(_openssh(_load_private(block).public_key()), "an unknown party")
                except (ValueError, TypeError) as err:
                    problems.append(f"{where}: a private key that cannot be read ({err}); remove it")
                    continue
                if owner not in own:
                    problems.append(f"{where}: {owner}'s private key is in {host}'s bundle")
    return problems
