"""The wheel the distribution tests install (tests/processes/test_wheel.py) and the container
image is built from (tests/processes/test_container_image.py): built once per module from a
copy of the sources."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("spec", "machine", "server", "simulation")
PIP = (sys.executable, "-m", "pip")


@pytest.fixture(scope="module", name="wheel")
def wheel_fixture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wheel built from a copy of the sources (the build leaves its files there)."""
    work = tmp_path_factory.mktemp("wheel")
    source = work / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    for package in PACKAGES:
        shutil.copytree(
            ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    out = work / "dist"
    subprocess.run(
        [
            *PIP,
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(out),
            str(source),
        ],
        check=True,
        capture_output=True,
    )
    [built] = out.glob("lockgate-*.whl")
    return built


__all__ = ["PACKAGES", "PIP", "ROOT", "wheel_fixture"]
