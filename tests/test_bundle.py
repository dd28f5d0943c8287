"""Per-host bundles (``fedvit deploy bundle``) without an engine: what each host folder holds, the secrets check
(which must turn red for a misplaced key), and compose files that are valid, separate projects."""

from __future__ import annotations

import shutil
import stat
from pathlib import Path

import pytest
import yaml

from fedvit.app.deployment.bundle import BundleError, check_bundles, write_bundles
from fedvit.app.deployment.compose import SUPERVISOR_TARGET
from fedvit.app.deployment.credentials import write_credentials
from fedvit.clients.encryption import EncryptionKey
from tests.test_deployment_files import validate

NODES = 3
ADDRESS = "fl.example.org:8443"


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> tuple[Path, Path, Path]:
    root = tmp_path_factory.mktemp("bundles")
    creds = root / "creds"
    write_credentials(creds, NODES, ["fl.example.org"])
    key = root / "encryption-key.safetensors"
    EncryptionKey.generate(12, 4, seed=0).save(key)
    write_bundles(root / "out", creds, NODES, ADDRESS, encryption_key=key, source=Path("/srv/fedvit"))
    return root / "out", creds, key


def copy_of(made, tmp_path: Path) -> Path:
    out = tmp_path / "out"
    shutil.copytree(made[0], out)
    return out


def files(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()}


def test_each_host_holds_exactly_its_own_material(made):
    out, _, _ = made
    assert sorted(p.name for p in out.iterdir()) == ["client-1", "client-2", "client-3", "server"]
    common = {"docker-compose.yml", ".env", "README.md", "credentials/ca.crt"}
    public_keys = {f"credentials/supernode-{i}.auth.pub" for i in range(1, NODES + 1)}
    assert files(out / "server") == common | public_keys | {"credentials/superlink.crt", "credentials/superlink.key"}
    for i in range(1, NODES + 1):
        own = {f"credentials/supernode-{i}.{ext}" for ext in ("crt", "key", "auth")}
        extra = {"keys/encryption-key.safetensors", "supernode_supervisor.py"}
        assert files(out / f"client-{i}") == common | own | extra
    for path in out.rglob("*"):
        if path.suffix in (".key", ".auth") or path.name.endswith(".safetensors"):
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    assert not list(out.rglob("ca.key"))
    assert check_bundles(out) == []


@pytest.mark.parametrize(
    "misplace",
    [
        ("creds", "supernode-2.auth", "client-1/credentials/spare.auth"),  # another client's authentication key
        ("creds", "supernode-3.key", "client-1/notes.txt"),  # another client's TLS key under an innocent name
        ("creds", "ca.key", "server/state/ca.key"),  # the CA's key, which no host needs
        ("creds", "superlink.key", "client-2/keys/superlink.key"),  # the SuperLink's key on a client
        ("key", None, "server/data/encryption-key.safetensors"),  # the clients' secret on the server
    ],
    ids=["other-auth-key", "renamed-tls-key", "ca-key", "superlink-key-on-client", "encryption-key-on-server"],
)
def test_a_misplaced_secret_turns_the_check_red(made, tmp_path, misplace):
    out = copy_of(made, tmp_path)
    kind, name, target = misplace
    source = made[1] / name if kind == "creds" else made[2]
    (out / target).parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, out / target)
    problems = check_bundles(out)
    assert len(problems) == 1 and problems[0].startswith(target), problems


def test_a_key_pasted_into_a_text_file_is_found(made, tmp_path):
    out = copy_of(made, tmp_path)
    env = out / "client-1" / ".env"
    env.write_text(env.read_text() + "# backup\n" + (made[1] / "supernode-2.key").read_text())
    (problem,) = check_bundles(out)
    assert "client-1/.env" in problem and "supernode-2" in problem


def test_compose_files_are_separate_projects_that_dial_the_published_port(made):
    out, _, _ = made
    names = set()
    for folder in sorted(out.iterdir()):
        assert validate(folder / "docker-compose.yml").returncode == 0
        document = yaml.safe_load((folder / "docker-compose.yml").read_text())
        names.add(document["name"])
        assert "networks" not in document  # each project gets its own default network, nothing shared
        for spec in document["services"].values():
            for volume in spec.get("volumes", []):
                assert volume.startswith(("./", "client-state-")), volume
                if volume.startswith("./"):
                    assert (folder / volume.split(":")[0]).exists(), volume  # inside the bundle or its own volume
            for secret in spec["secrets"]:
                assert (folder / document["secrets"][secret["source"]]["file"]).is_file()
    assert len(names) == NODES + 1
    server = yaml.safe_load((out / "server" / "docker-compose.yml").read_text())["services"]
    assert server["superlink"]["ports"] == ["${SUPERLINK_PORT:-8443}:8000"]
    assert "superlink:8000" in server["superexec-serverapp"]["command"]
    assert (out / "server" / ".env").read_text() == "FEDVIT_SOURCE=/srv/fedvit\nSUPERLINK_PORT=8443\n"
    client = yaml.safe_load((out / "client-2" / "docker-compose.yml").read_text())["services"]
    node = client["supernode-2"]
    assert "depends_on" not in node and node["entrypoint"] == ["python", SUPERVISOR_TARGET]
    assert node["volumes"] == [f"./supernode_supervisor.py:{SUPERVISOR_TARGET}:ro"]
    assert node["command"][node["command"].index("--superlink") + 1].startswith("${SUPERLINK_ADDRESS:?")
    assert "partition-id=1 num-partitions=3" in node["command"]
    assert f"SUPERLINK_ADDRESS={ADDRESS}" in (out / "client-2" / ".env").read_text()


def test_refuses_an_address_the_certificate_does_not_name(made, tmp_path):
    with pytest.raises(BundleError, match="--superlink-name other.example.org"):
        write_bundles(tmp_path / "b", made[1], NODES, "other.example.org:8000")
    with pytest.raises(BundleError, match="host:port"):
        write_bundles(tmp_path / "b", made[1], NODES, "fl.example.org")
    write_bundles(tmp_path / "b", made[1], NODES, ADDRESS)
    with pytest.raises(BundleError, match="--force"):
        write_bundles(tmp_path / "b", made[1], NODES, ADDRESS)
