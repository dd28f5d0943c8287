"""Flower's base images for the compose deployment: pulled from Docker Hub, or local stand-ins where it is out of reach.

``docker-compose.yml`` runs Flower's SuperLink and SuperNode images, and ``deploy/superexec.Dockerfile`` builds
fedvit's executor image on Flower's SuperExec image. :func:`ensure_base_images` makes those three tags present:
an image already there is used, a missing one is pulled, and only when a pull fails is a stand-in built under the
same tag (``deploy/flower-standin.Dockerfile``: a Debian rootfs from ``mmdebstrap``, ``docker import``-ed, plus
PyPI's ``flwr``), so the compose file and the Dockerfile run unchanged.
"""

from __future__ import annotations

import re
import shutil
import ssl
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from fedvit.app.deployment.compose import DOCKERFILE, IMAGES
from fedvit.app.deployment.topology import FLWR_VERSION

STANDIN_DOCKERFILE = "deploy/flower-standin.Dockerfile"
STANDIN_LABEL = "org.fedvit.stand-in"
FLOWER_DEFAULT_PYTHON = "3.13"  # Python of Flower's un-suffixed SuperExec tags (see flower_image_python)
ROOTFS_IMAGE = "fedvit/debian-rootfs:bookworm"
DEBIAN_SUITE = "bookworm"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
# What Flower's images carry that the executables need: Python with venv, TLS roots, SQLite (the SuperLink's state).
ROOTFS_PACKAGES = ["python3", "python3-venv", "ca-certificates", "libsqlite3-0"]


class ImageError(RuntimeError):
    """A base image could be neither found, pulled nor built."""


def superexec_base_image(dockerfile: Path) -> str:
    """The image the SuperExec Dockerfile builds on: its first ``FROM``, with the ``ARG`` defaults before it."""
    args: dict[str, str] = {}
    for line in dockerfile.read_text().splitlines():
        words = line.split()
        if words[:1] == ["ARG"] and "=" in words[1]:
            name, _, default = words[1].partition("=")
            args[name] = default.strip("\"'")
        elif words[:1] == ["FROM"]:
            return re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), words[1])
    raise ImageError(f"{dockerfile} has no FROM line")


def flower_image_python(image: str) -> str:
    """The Python of one of Flower's images, from its tag: ``<version>-py3.12-ubuntu24.04`` says 3.12; a bare
    ``<version>`` tag is Flower's default, for the SuperExec image of releases >= 1.24 the newest Python it
    supports, 3.13 (Flower's image README on Docker Hub lists ``1.25.0`` as ``1.25.0-py3.13-ubuntu24.04``)."""
    match = re.search(r":[^:]*-py(\d+\.\d+)-", image)
    return match.group(1) if match else FLOWER_DEFAULT_PYTHON


def base_images(app_dir: Path) -> dict[str, str]:
    """Build target of the stand-in Dockerfile -> the tag the compose deployment expects."""
    return {
        "superlink": IMAGES["flower-superlink"],
        "supernode": IMAGES["flower-supernode"],
        "superexec": superexec_base_image(app_dir / DOCKERFILE),
    }


def _docker(*args: str, capture: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *args], capture_output=capture, text=True, check=False)


def is_standin(image: str) -> bool:
    done = _docker("image", "inspect", "--format", f'{{{{index .Config.Labels "{STANDIN_LABEL}"}}}}', image)
    return done.returncode == 0 and done.stdout.strip() not in ("", "<no value>")


def ensure_base_images(app_dir: Path, pull: bool = True, log: Callable[[str], None] = print) -> dict[str, str]:
    """Make every base image present; returns tag -> how: ``present``, ``pulled`` or ``stand-in built``."""
    if shutil.which("docker") is None:
        raise ImageError("the docker CLI is not installed")
    if _docker("info").returncode != 0:
        raise ImageError("no Docker engine answers (docker info failed); start dockerd first")
    how, missing = {}, {}
    for target, image in base_images(app_dir).items():
        if _docker("image", "inspect", image).returncode == 0:
            how[image] = "present (a fedvit stand-in)" if is_standin(image) else "present"
            continue
        if pull:
            log(f"pulling {image} ...")
            done = _docker("pull", image)
            if done.returncode == 0:
                how[image] = "pulled"
                continue
            reason = (done.stderr.strip().splitlines() or ["no reason given"])[-1]
            log(f"could not pull {image}: {reason}")
        missing[target] = image
    if missing:
        log(
            f"building local stand-ins for {', '.join(missing.values())} from Debian packages and PyPI "
            f"flwr=={FLWR_VERSION} ({STANDIN_DOCKERFILE}); they replace Flower's official images on this machine only"
        )
        build_standins(app_dir, missing, log)
        how |= {image: "stand-in built" for image in missing.values()}
    for image, state in how.items():
        log(f"{image}: {state}")
    return how


def host_ca_bundle() -> Path:
    """The CA bundle this host trusts (a TLS-intercepting proxy's CA included), for pip inside the stand-ins."""
    for candidate in (ssl.get_default_verify_paths().cafile, "/etc/ssl/certs/ca-certificates.crt"):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    raise ImageError("no CA bundle found on this host (install Debian's ca-certificates)")


def build_rootfs(mirror: str = DEBIAN_MIRROR, log: Callable[[str], None] = print) -> None:
    """``mmdebstrap`` a minimal Debian into a tarball on stdout, ``docker import``-ed as :data:`ROOTFS_IMAGE`."""
    if shutil.which("mmdebstrap") is None:
        raise ImageError("mmdebstrap is not installed (Debian: apt-get install mmdebstrap)")
    log(f"mmdebstrap {DEBIAN_SUITE} ({', '.join(ROOTFS_PACKAGES)}) -> docker import {ROOTFS_IMAGE}")
    strap = subprocess.Popen(
        ["mmdebstrap", "--variant=minbase", f"--include={','.join(ROOTFS_PACKAGES)}", DEBIAN_SUITE, "-", mirror],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    imported = subprocess.run(["docker", "import", "-", ROOTFS_IMAGE], stdin=strap.stdout, capture_output=True)
    strap.stdout.close()
    strap_err = strap.stderr.read().decode(errors="replace")
    if strap.wait() != 0 or imported.returncode != 0:
        detail = strap_err.strip().splitlines()[-5:] + imported.stderr.decode(errors="replace").strip().splitlines()
        raise ImageError("building the Debian rootfs failed:\n  " + "\n  ".join(detail))


def build_standins(app_dir: Path, targets: dict[str, str], log: Callable[[str], None] = print) -> None:
    """Build the stand-in for each ``target -> tag`` (the rootfs first, unless already imported)."""
    if _docker("image", "inspect", ROOTFS_IMAGE).returncode != 0:
        build_rootfs(log=log)
    with tempfile.TemporaryDirectory(prefix="fedvit-standin-") as context:
        shutil.copyfile(host_ca_bundle(), Path(context) / "host-ca-certificates.crt")
        for target, image in targets.items():
            log(f"docker build --target {target} -t {image}")
            done = _docker(
                "build",
                "-f", str(app_dir / STANDIN_DOCKERFILE),
                "--target", target,
                "--build-arg", f"ROOTFS={ROOTFS_IMAGE}",
                "--build-arg", f"FLWR_VERSION={FLWR_VERSION}",
                "-t", image,
                context,
                capture=False,
            )  # fmt: skip
            if done.returncode != 0:
                raise ImageError(f"building the stand-in {image} failed (docker build exit {done.returncode})")
