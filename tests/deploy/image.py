"""Build the Dockerfile with buildah and open the image's root filesystem (make test-image).

No container engine runs here and no OCI runtime can start a container in this sandbox
(docs/decisions/0031), but buildah builds images (`--isolation chroot`) and mounts them.
The base image comes from a registry when one answers; otherwise a stand-in is built
with debootstrap from Debian's packages (Debian 12 and its Python 3.11, in place of
`python:3.12-slim-bookworm`) and passed as the Dockerfile's PYTHON_IMAGE.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.deploy.manifests import ROOT

IMAGE = "localhost/cronstream:test"
STAND_IN_BASE = "localhost/cronstream-python-standin:bookworm"
DEBIAN_MIRROR = os.environ.get("CRONSTREAM_DEBIAN_MIRROR", "http://deb.debian.org/debian")
# A machine behind a TLS-intercepting proxy (this one) trusts the proxy's CA in its own
# bundle and tells pip where it is: the build's RUN steps get both, read-only.
BUILD_MOUNTS = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pip.conf")


def _run(*argv: str, timeout: float = 900) -> str:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if result.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} failed ({result.returncode}):\n"
                             f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result.stdout.strip()


def _exists(image: str) -> bool:
    return subprocess.run(["buildah", "inspect", "--type", "image", image], capture_output=True,
                          check=False).returncode == 0


def base_image(wanted: str) -> tuple[str, str]:
    """The base to build on, and why: `wanted` if it can be pulled, else the stand-in."""
    pulled = subprocess.run(["buildah", "pull", "--quiet", wanted], capture_output=True,
                            text=True, timeout=300, check=False)
    if pulled.returncode == 0:
        return wanted, f"pulled {wanted}"
    reason = f"cannot pull {wanted}: {pulled.stderr.strip().splitlines()[-1]}"
    if not _exists(STAND_IN_BASE):
        if shutil.which("debootstrap") is None:
            raise AssertionError(f"{reason}; and debootstrap is not installed for a stand-in")
        with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
            rootfs = Path(tmp, "rootfs")
            _run("debootstrap", "--variant=minbase", "--include=python3,python3-venv,ca-certificates",
                 "bookworm", str(rootfs), DEBIAN_MIRROR, timeout=1800)
            for cache in ("var/cache/apt/archives", "var/lib/apt/lists"):
                shutil.rmtree(rootfs / cache, ignore_errors=True)
            container = _run("buildah", "from", "scratch")
            try:
                mount = _run("buildah", "mount", container)
                _run("cp", "-a", f"{rootfs}/.", mount)
                _run("buildah", "config", "--env",
                     "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", container)
                _run("buildah", "commit", "--quiet", container, STAND_IN_BASE)
            finally:
                subprocess.run(["buildah", "rm", container], capture_output=True, check=False)
    return STAND_IN_BASE, f"{reason}; built on {STAND_IN_BASE} (debootstrap, Debian 12)"


def build(base: str) -> None:
    mounts = [arg for path in BUILD_MOUNTS if Path(path).exists()
              for arg in ("--volume", f"{path}:{path}:ro")]
    _run("buildah", "bud", "--isolation", "chroot", "--layers", *mounts,
         "--build-arg", f"PYTHON_IMAGE={base}", "--tag", IMAGE, str(ROOT), timeout=1800)


@dataclass
class OpenImage:
    rootfs: Path
    entrypoint: list[str]
    env: dict[str, str]
    user: str
    workdir: str
    size: str  # as buildah reports it, e.g. "262 MB"


@contextmanager
def open_image(image: str = IMAGE) -> Iterator[OpenImage]:
    """The image's root filesystem, mounted, and its configuration (OCI config)."""
    info = json.loads(_run("buildah", "inspect", "--type", "image", image))
    config = info["OCIv1"]["config"]
    size = _run("buildah", "images", "--format", "{{.Size}}", image)
    container = _run("buildah", "from", image)
    try:
        rootfs = Path(_run("buildah", "mount", container))
        yield OpenImage(
            rootfs=rootfs,
            entrypoint=list(config.get("Entrypoint") or []),
            env=dict(item.split("=", 1) for item in config.get("Env", [])),
            user=str(config.get("User") or "0:0"),
            workdir=str(config.get("WorkingDir") or "/"),
            size=size,
        )
    finally:
        subprocess.run(["buildah", "umount", container], capture_output=True, check=False)
        subprocess.run(["buildah", "rm", container], capture_output=True, check=False)
