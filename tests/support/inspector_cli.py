"""The MCP Inspector's command line (`mcp-inspector --cli`, npm `@modelcontextprotocol/inspector`,
pinned in `tests/support/inspector/package.json`), installed from the registry on first use
next to the virtualenv and run with the wheel's Node. Each run is a client of its own: it
connects (a new session), makes one call, prints the result as JSON and leaves."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support.npm import NODE, npm_installed

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "tests" / "support" / "inspector" / "package.json"
#: Installed once per checkout, next to the virtualenv (`make clean` removes it).
INSTALL = ROOT / ".venv" / "inspector"
VERSION = "2.12.0"


@pytest.fixture(name="inspector", scope="session")
def inspector_fixture() -> Path:
    """The Inspector's executable, installed from the npm registry (pinned)."""
    npm_installed(PACKAGE, INSTALL, "@modelcontextprotocol/inspector", VERSION)
    return INSTALL / "node_modules" / ".bin" / "mcp-inspector"


def inspect(executable: Path, url: str, key: str, method: str, *args: str) -> Any:
    """One Inspector CLI call on `url` with a Bearer key; its printed JSON result."""
    done = subprocess.run(
        [
            str(executable),
            "--cli",
            url,
            "--transport",
            "http",
            "--header",
            f"Authorization: Bearer {key}",
            "--method",
            method,
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": f"{NODE.parent}:/usr/bin:/bin", "HOME": str(INSTALL)},
    )
    assert done.returncode == 0, (
        f"inspector failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    )
    return json.loads(done.stdout)
