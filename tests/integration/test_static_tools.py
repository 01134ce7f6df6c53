"""Static tools see the package as the interpreter does (issue 15): mypy resolves types
across modules — a wrong assignment that crosses them fails `make lint` — and pyright (what
editors run) resolves every import of the package."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import CI

ROOT = Path(__file__).resolve().parents[2]
# `make pyright` installs it here, at the version the Makefile pins (PYRIGHT_VERSION).
PYRIGHT = ROOT / ".venv" / "pyright" / "node_modules" / ".bin" / "pyright"


def _scratch_copy(tmp_path: Path) -> Path:
    """The committed tree (symlinks kept), outside the repository."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    target = tmp_path / "tree"
    for name in filter(None, files.decode().split("\0")):
        source, dest = ROOT / name, target / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            dest.symlink_to(source.readlink())
        elif source.is_file():
            shutil.copy2(source, dest)
    return target


def test_a_type_error_across_modules_fails_mypy(tmp_path: Path) -> None:
    tree = _scratch_copy(tmp_path)
    clean = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "cache")],
                           cwd=tree, capture_output=True, text=True, check=False)
    assert clean.returncode == 0, clean.stdout[-3000:]
    planted = tree / "services" / "dispatcher" / "dedupe.py"
    planted.write_text(planted.read_text() + (
        "\n\ndef _planted() -> int:\n"
        "    from cronstream.shared.records import JobDue\n"
        "    due: JobDue | None = None\n"
        "    return due.execution_id  # a UUID (or None), never an int\n"))
    broken = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "cache")],
                            cwd=tree, capture_output=True, text=True, check=False)
    assert broken.returncode != 0
    assert "dedupe.py" in broken.stdout and "UUID" in broken.stdout, broken.stdout[-3000:]


def test_pyright_resolves_every_import_of_the_package() -> None:
    if not PYRIGHT.exists():
        message = f"{PYRIGHT} is missing: `make pyright` installs it (`make test` does)"
        if CI:
            pytest.fail(message)
        pytest.skip(message)
    # The repository's own pyrightconfig.json: what an editor (Pylance) reads.
    done = subprocess.run([str(PYRIGHT), "--outputjson"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600, check=False)
    report = json.loads(done.stdout)
    unresolved = [f"{d['file']}: {d['message']}" for d in report["generalDiagnostics"]
                  if d.get("rule") == "reportMissingImports"]
    assert unresolved == []
    assert report["summary"]["filesAnalyzed"] > 60, "pyright saw the services and shared modules"


def test_make_tools_says_which_tool_is_missing_and_how_to_get_it(tmp_path: Path) -> None:
    # A machine with everything but kubectl (`make tools` ran before this suite, so the
    # pinned pyright and promtool are in the virtualenv; Chromium is found on PATH).
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("chromium", "kubectl"):
        found = shutil.which(tool)
        assert found, f"{tool} is missing here: `make tools` would have said so"
        (bin_dir / tool).symlink_to(found)
    make = shutil.which("make")
    assert make is not None

    def tools(path: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([make, "-s", "tools"], cwd=ROOT, env={"PATH": path, "HOME": str(tmp_path)},
                              capture_output=True, text=True, timeout=120, check=False)

    assert tools(str(bin_dir)).returncode == 0
    (bin_dir / "kubectl").unlink()
    missing = tools(str(bin_dir))
    assert missing.returncode != 0
    assert "kubectl is missing" in missing.stderr and "install kubectl" in missing.stderr
