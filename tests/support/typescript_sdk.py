"""The official TypeScript SDK client for the tests: npm `@modelcontextprotocol/sdk`, pinned
in `tests/support/ts_client/package.json`, installed from the registry on first use (next to
the virtualenv, reused afterwards) and run with the machine's node. The scripts it runs are
in `tests/support/ts_client/`; each takes the SDK's folder from LOCKGATE_TS_SDK."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TS_CLIENT = ROOT / "tests" / "support" / "ts_client"
#: Installed once per checkout, next to the virtualenv (`make clean` removes it).
TS_INSTALL = ROOT / ".venv" / "ts-client"
TS_SDK_VERSION = "1.32.2"


@pytest.fixture(name="ts_sdk", scope="session")
def ts_sdk_fixture() -> Path:
    """The official TypeScript SDK from the npm registry, pinned (`package.json`)."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.fail("node and npm are needed (Debian: apt-get install nodejs npm)")
    sdk = TS_INSTALL / "node_modules" / "@modelcontextprotocol" / "sdk"
    installed = sdk / "package.json"
    if not installed.exists() or json.loads(installed.read_text())["version"] != TS_SDK_VERSION:
        TS_INSTALL.mkdir(parents=True, exist_ok=True)
        shutil.copy(TS_CLIENT / "package.json", TS_INSTALL / "package.json")
        done = subprocess.run(
            ["npm", "install", "--no-audit", "--no-fund", "--loglevel=error"],
            cwd=TS_INSTALL,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, f"npm install failed:\n{done.stdout}\n{done.stderr}"
    assert json.loads(installed.read_text())["version"] == TS_SDK_VERSION
    return sdk
