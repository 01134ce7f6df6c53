"""The image builds, runs `cronstream --version`, and runs the end-to-end test of the
manifests with every service started from it (make test-image; root and buildah needed).

Not part of `make test`: a build takes minutes (longer where the base image must be made
with debootstrap). Each process runs from the image's root filesystem, mounted read-only,
with a tmpfs on /tmp, as the image's user, through tests/deploy/run-in-rootfs.sh — what a
container runtime would do for a pod with `readOnlyRootFilesystem: true`; no OCI runtime
can start a container in this sandbox (docs/decisions/0031).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.deploy import image
from tests.deploy.running import run_prod_end_to_end

RUNNER = Path(__file__).with_name("run-in-rootfs.sh")

# The module's first test also builds the image (and perhaps its base): minutes.
pytestmark = [pytest.mark.image, pytest.mark.timeout(2400)]


@pytest.fixture(scope="module")
def opened() -> Iterator[image.OpenImage]:
    if not os.environ.get("CRONSTREAM_TEST_IMAGE"):
        pytest.skip("builds a container image: run it with `make test-image`")
    assert shutil.which("buildah"), "buildah is not installed (apt-get install buildah)"
    assert os.geteuid() == 0, "mounting an image's root filesystem needs root"
    base, why = image.base_image("docker.io/library/python:3.12-slim-bookworm")
    print(f"\nbase image: {why}")
    image.build(base)
    with image.open_image() as opened:
        print(f"image {image.IMAGE}: {opened.size}, user {opened.user}, "
              f"entrypoint {opened.entrypoint}")
        yield opened


def _argv(opened: image.OpenImage, *args: str) -> list[str]:
    return [str(RUNNER), str(opened.rootfs), opened.user, opened.workdir, *opened.entrypoint, *args]


def test_image_runs_cronstream_version_as_non_root_on_a_read_only_root(opened: image.OpenImage) -> None:
    assert opened.user.split(":")[0] not in ("", "0", "root")
    version = subprocess.run(_argv(opened, "--version"), env=opened.env, capture_output=True,
                             text=True, timeout=60, check=False)
    assert version.returncode == 0 and "cronstream, version" in version.stdout, version
    writes = subprocess.run(
        [str(RUNNER), str(opened.rootfs), opened.user, opened.workdir, "sh", "-c",
         "id -u; touch /opt/cronstream/x 2>/dev/null && echo root-writable; "
         "touch /tmp/x && echo tmp-writable"],
        env=opened.env, capture_output=True, text=True, timeout=60, check=False)
    assert writes.stdout.split() == [opened.user.split(":")[0], "tmp-writable"], writes


def test_prod_manifests_run_a_job_end_to_end_from_the_image(
    opened: image.OpenImage, servers: tuple[str, str], empty_database: str, tmp_path: Path,
) -> None:
    kafka, _ = servers

    def launcher(_tmp: Path) -> tuple[list[str], dict[str, str]]:
        return _argv(opened), dict(opened.env)

    # An image has no /etc/hosts (a runtime provides one): name the local servers by address.
    run_prod_end_to_end(kafka.replace("localhost", "127.0.0.1"),
                        empty_database.replace("@localhost", "@127.0.0.1"), tmp_path, launcher)
