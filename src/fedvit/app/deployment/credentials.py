"""TLS certificates and SuperNode authentication keys for a deployment (``fedvit deploy credentials``).

One private CA signs a certificate per server: the SuperLink (dialled by SuperNodes, SuperExecs and the
``flwr`` CLI) and each SuperNode's Runtime API (dialled by its ClientApp SuperExec). Each SuperNode also gets
an ECDSA P-384 key pair in OpenSSH format for SuperNode authentication; the public halves are registered with
``flwr supernode register`` (:func:`register_command`). Private keys are written 0600 and never overwritten.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from fedvit.app.deployment.topology import supernode_name

VALID_DAYS = 365
LOCAL_NAMES = ("localhost", "127.0.0.1")


class CredentialsError(RuntimeError):
    """Credentials exist already (and would be replaced) or are missing."""


def write_file(path: Path, data: bytes, private: bool) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [x509.NameAttribute(NameOID.ORGANIZATION_NAME, "fedvit"), x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    )


def _san(names: list[str]) -> x509.SubjectAlternativeName:
    entries: list[x509.GeneralName] = []
    for name in names:
        try:
            entries.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            entries.append(x509.DNSName(name))
    return x509.SubjectAlternativeName(entries)


def _certificate(subject: x509.Name, issuer: x509.Name, public_key, signing_key, *, ca: bool, names: list[str]):
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=VALID_DAYS))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if not ca:
        builder = builder.add_extension(_san(names), critical=False)
    return builder.sign(signing_key, hashes.SHA384())


def server_names(num_supernodes: int, superlink_names: list[str] = ()) -> dict[str, list[str]]:
    """Subject alternative names per server certificate: its compose service name, loopback names, extras."""
    names = {"superlink": ["superlink", *LOCAL_NAMES, *superlink_names]}
    for i in range(num_supernodes):
        names[supernode_name(i)] = [supernode_name(i), *LOCAL_NAMES]
    return names


def write_credentials(
    out: Path, num_supernodes: int, superlink_names: list[str] = (), force: bool = False
) -> list[Path]:
    """Write CA, server certificates and SuperNode auth keys into ``out``; returns the files written."""
    out.mkdir(parents=True, exist_ok=True)
    names = server_names(num_supernodes, list(superlink_names))
    files = ["ca.crt", "ca.key"] + [f"{s}.{ext}" for s in names for ext in ("crt", "key")]
    files += [f"{supernode_name(i)}.{ext}" for i in range(num_supernodes) for ext in ("auth", "auth.pub")]
    existing = [f for f in files if (out / f).exists()]
    if existing and not force:
        raise CredentialsError(f"{out} already holds {', '.join(existing[:3])}...; pass --force to replace them")
    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_name = _name("fedvit deployment CA")
    ca_cert = _certificate(ca_name, ca_name, ca_key.public_key(), ca_key, ca=True, names=[])
    write_file(out / "ca.crt", ca_cert.public_bytes(serialization.Encoding.PEM), private=False)
    write_file(out / "ca.key", _key_pem(ca_key), private=True)
    for server, sans in names.items():
        key = ec.generate_private_key(ec.SECP384R1())
        cert = _certificate(_name(server), ca_name, key.public_key(), ca_key, ca=False, names=sans)
        write_file(out / f"{server}.crt", cert.public_bytes(serialization.Encoding.PEM), private=False)
        write_file(out / f"{server}.key", _key_pem(key), private=True)
    for i in range(num_supernodes):
        key = ec.generate_private_key(ec.SECP384R1())
        private = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
        )
        public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        write_file(out / f"{supernode_name(i)}.auth", private, private=True)
        write_file(out / f"{supernode_name(i)}.auth.pub", public + f" {supernode_name(i)}\n".encode(), private=False)
    return [out / f for f in files]


def register_command(flwr: str, credentials: Path, index: int, connection: str) -> list[str]:
    """``flwr supernode register`` for SuperNode ``index``'s public key."""
    public = credentials / f"{supernode_name(index)}.auth.pub"
    if not public.is_file():
        raise CredentialsError(f"{public} is missing; run `fedvit deploy credentials {credentials}` first")
    return [flwr, "supernode", "register", str(public), connection, "--name", supernode_name(index)]
