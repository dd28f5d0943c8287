"""The deployment definition without an engine: compose file, its consistency with the loopback processes,
credentials and the CLI connection."""

from __future__ import annotations

import ipaddress
import re
import stat
import subprocess
import sys
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_ssh_private_key, load_ssh_public_key
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from fedvit.app.deployment import compose
from fedvit.app.deployment.connection import add_connection
from fedvit.app.deployment.credentials import CredentialsError, write_credentials
from fedvit.app.deployment.images import flower_image_python, superexec_base_image
from fedvit.app.deployment.loopback import LoopbackDeployment
from fedvit.app.deployment.topology import FLWR_VERSION, credential_names

ROOT = Path(__file__).resolve().parents[1]


def flags(argv: list[str]) -> list[str]:
    return [a for a in argv if a.startswith("--")]


def committed(name: str) -> dict:
    return yaml.safe_load((ROOT / name).read_text())


def validate(path: Path) -> subprocess.CompletedProcess:
    """compose-spec JSON-schema validation (check-jsonschema's bundled copy of the schema)."""
    cli = Path(sys.executable).parent / "check-jsonschema"
    return subprocess.run(
        [str(cli), "--builtin-schema", "vendor.compose-spec", str(path)], capture_output=True, text=True, check=False
    )


def test_committed_compose_files_are_the_rendered_definition():
    assert (ROOT / compose.COMPOSE_FILE).read_text() == compose.to_yaml(compose.render())
    assert (ROOT / compose.GPU_FILE).read_text() == compose.to_yaml(compose.render_gpu())


def test_compose_files_pass_the_compose_spec_schema_and_a_broken_one_fails(tmp_path):
    for name in (compose.COMPOSE_FILE, compose.GPU_FILE):
        done = validate(ROOT / name)
        assert done.returncode == 0, done.stdout + done.stderr
    broken = compose.render()
    broken["services"]["superlink"]["restart"] = "sometimes"  # not an allowed value
    broken["services"]["supernode-1"]["comand"] = ["typo"]  # unknown key
    (tmp_path / "broken.yml").write_text(compose.to_yaml(broken))
    assert validate(tmp_path / "broken.yml").returncode != 0


def test_every_service_runs_the_loopback_process_of_the_same_name_with_the_same_flags(tmp_path):
    services = committed(compose.COMPOSE_FILE)["services"]
    loopback = {p.name: p for p in _loopback_processes(tmp_path, 5)}
    assert set(services) == set(loopback)
    for name, spec in services.items():
        assert flags(spec["command"]) == flags(loopback[name].argv), name
        assert spec["image"] == compose.IMAGES[loopback[name].program], name


def _loopback_processes(tmp_path: Path, n: int):
    from fedvit.app.deployment.topology import processes

    return processes(LoopbackDeployment(tmp_path, n).layout)


def _arg(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_images_ports_and_addresses_are_consistent():
    doc = committed(compose.COMPOSE_FILE)
    services = doc["services"]
    assert FLWR_VERSION == version("flwr")
    assert services["superlink"]["image"] == f"flwr/superlink:{FLWR_VERSION}"
    assert services["supernode-1"]["image"] == f"flwr/supernode:{FLWR_VERSION}"
    assert superexec_base_image(ROOT / compose.DOCKERFILE).startswith(f"flwr/superexec:{FLWR_VERSION}")
    superlink_port = _arg(services["superlink"]["command"], "--port")
    assert services["superlink"]["ports"] == [f"{superlink_port}:{superlink_port}"]
    nodes = [n for n in services if n.startswith("supernode-")]
    assert len(nodes) == 5
    for i, node in enumerate(sorted(nodes, key=lambda n: int(n.split("-")[1]))):
        cmd = services[node]["command"]
        assert _arg(cmd, "--superlink") == f"superlink:{superlink_port}"
        assert _arg(cmd, "--node-config") == f"partition-id={i} num-partitions=5"
        executor = services[f"superexec-clientapp-{i + 1}"]
        assert _arg(executor["command"], "--runtime-api-address") == f"{node}:{_arg(cmd, '--port')}"
        assert executor["depends_on"] == [node] and "build" in executor
    serverapp = services["superexec-serverapp"]["command"]
    assert _arg(serverapp, "--runtime-api-address") == f"superlink:{superlink_port}"
    # TLS and authentication on; no process runs insecure or installs dependencies at run time.
    everything = [a for s in services.values() for a in s["command"]]
    assert "--insecure" not in everything and "--allow-runtime-dependency-installation" not in everything
    assert "--enable-supernode-auth" in services["superlink"]["command"]


@pytest.mark.parametrize(
    ("from_lines", "python"),
    [
        ("ARG SUPEREXEC_BASE=flwr/superexec:1.41.0-py3.12-ubuntu24.04\nFROM ${SUPEREXEC_BASE}", "3.12"),
        ("ARG FLWR_VERSION=1.41.0\nFROM flwr/superexec:${FLWR_VERSION}", "3.13"),  # before the fix: Flower's default
        ("FROM flwr/superexec:1.41.0-py3.11-ubuntu24.04 AS base", "3.11"),
    ],
)
def test_base_image_python_is_read_from_the_dockerfile(tmp_path, from_lines, python):
    (tmp_path / "Dockerfile").write_text(f"# comment\n{from_lines}\nRUN true\n")
    assert flower_image_python(superexec_base_image(tmp_path / "Dockerfile")) == python


def test_superexec_base_image_python_satisfies_requires_python():
    """`pip install .` in the image refuses a Python outside requires-python (Flower's bare tag is 3.13)."""
    base = superexec_base_image(ROOT / compose.DOCKERFILE)
    requires = SpecifierSet(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"])
    python = flower_image_python(base)
    assert Version(python) in requires, f"{base} runs Python {python}; pyproject requires-python is {requires}"


def test_each_container_gets_only_its_own_credentials():
    doc = committed(compose.COMPOSE_FILE)
    needs = credential_names(5)
    for name, spec in doc["services"].items():
        got = {s["source"] for s in spec["secrets"]}
        assert got == set(needs[name]), name
        for path in spec["command"]:  # every credential a command names is mounted
            if path.startswith("/app/credentials/"):
                assert path.rsplit("/", 1)[1] in got, (name, path)
        private = {s for s in got if s.endswith((".key", ".auth"))}
        assert all(s.rsplit(".", 1)[0] == name for s in private), (name, private)  # only its own private keys
        keys_mounted = any(v.startswith("./deploy/keys:") for v in spec.get("volumes", []))
        assert keys_mounted == name.startswith("superexec-clientapp-"), name
    assert all(s["file"].startswith("./deploy/credentials/") for s in doc["secrets"].values())
    assert "ca.key" not in doc["secrets"]  # the CA's private key stays on the host that made the credentials


def test_gpu_override_reserves_gpu_for_client_executors_only():
    gpu = committed(compose.GPU_FILE)["services"]
    base = committed(compose.COMPOSE_FILE)["services"]
    assert set(gpu) <= set(base)
    for name, spec in gpu.items():
        assert "cu" in spec["build"]["args"]["TORCH_INDEX"]
        devices = spec.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices")
        if name.startswith("superexec-clientapp-"):
            assert devices == [{"driver": "nvidia", "device_ids": ["0"], "capabilities": ["gpu"]}]
        else:
            assert devices is None


def test_remote_superlink_address_reaches_every_supernode():
    services = compose.render(3, "fl.example.org:443")["services"]
    for i in range(3):
        assert _arg(services[f"supernode-{i + 1}"]["command"], "--superlink") == "fl.example.org:443"
    with pytest.raises(ValueError, match="host:port"):
        compose.render(3, "fl.example.org")


def test_credentials_chain_names_permissions_and_no_overwrite(tmp_path):
    files = write_credentials(tmp_path, 2, ["fl.example.org", "10.0.0.5"])
    ca = x509.load_pem_x509_certificate((tmp_path / "ca.crt").read_bytes())
    for server, names in {
        "superlink": {"superlink", "localhost", "fl.example.org"},
        "supernode-2": {"supernode-2", "localhost"},
    }.items():
        cert = x509.load_pem_x509_certificate((tmp_path / f"{server}.crt").read_bytes())
        cert.verify_directly_issued_by(ca)
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert names <= set(san.get_values_for_type(x509.DNSName))
        assert ipaddress.ip_address("127.0.0.1") in san.get_values_for_type(x509.IPAddress)
    san = x509.load_pem_x509_certificate((tmp_path / "superlink.crt").read_bytes()).extensions
    assert ipaddress.ip_address("10.0.0.5") in san.get_extension_for_class(
        x509.SubjectAlternativeName
    ).value.get_values_for_type(x509.IPAddress)
    for path in files:
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == (0o600 if path.suffix in (".key", ".auth") else 0o644), path
    private = load_ssh_private_key((tmp_path / "supernode-1.auth").read_bytes(), None)
    public = load_ssh_public_key((tmp_path / "supernode-1.auth.pub").read_bytes())
    assert isinstance(private, ec.EllipticCurvePrivateKey) and private.curve.name == "secp384r1"
    assert private.public_key().public_numbers() == public.public_numbers()
    before = (tmp_path / "ca.crt").read_bytes()
    with pytest.raises(CredentialsError, match="--force"):
        write_credentials(tmp_path, 2)
    assert (tmp_path / "ca.crt").read_bytes() == before
    write_credentials(tmp_path, 2, force=True)
    assert (tmp_path / "ca.crt").read_bytes() != before


def test_connection_is_added_once_and_never_silently_changed(tmp_path):
    config = add_connection(tmp_path, "fedvit-docker", "127.0.0.1:8000", tmp_path / "ca.crt")
    text = config.read_text()
    assert re.search(r'\[superlink\]\ndefault = "local"', text)
    assert f'root-certificates = "{(tmp_path / "ca.crt").resolve()}"' in text
    add_connection(tmp_path, "fedvit-docker", "127.0.0.1:8000", tmp_path / "ca.crt")
    assert config.read_text() == text
    with pytest.raises(ValueError, match="differently"):
        add_connection(tmp_path, "fedvit-docker", "127.0.0.1:9000", tmp_path / "ca.crt")
