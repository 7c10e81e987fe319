"""npm packages the tests run with the machine's node, installed from the registry on first
use into a folder next to the virtualenv (pinned by a package.json kept in tests/support/)
and reused while the pinned version is the one installed."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest


def npm_installed(
    package_json: Path,
    install: Path,
    package: str,
    version: str,
    npm: Sequence[str] = ("npm",),
) -> Path:
    """`package` at `version` under `install/node_modules`, installed from `package_json`
    when absent or another version, with `npm` (default: the machine's); its folder."""
    if tuple(npm) == ("npm",) and (shutil.which("node") is None or shutil.which("npm") is None):
        pytest.fail("node and npm are needed (Debian: apt-get install nodejs npm)")
    folder = install / "node_modules" / package
    installed = folder / "package.json"
    if not installed.exists() or json.loads(installed.read_text())["version"] != version:
        install.mkdir(parents=True, exist_ok=True)
        shutil.copy(package_json, install / "package.json")
        done = subprocess.run(
            [*npm, "install", "--no-audit", "--no-fund", "--loglevel=error"],
            cwd=install,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, f"npm install failed:\n{done.stdout}\n{done.stderr}"
    assert json.loads(installed.read_text())["version"] == version
    return folder
