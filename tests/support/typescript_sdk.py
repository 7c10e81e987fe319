"""The official TypeScript SDK client for the tests: npm `@modelcontextprotocol/sdk`, pinned
in `tests/support/ts_client/package.json`, installed from the registry on first use (next to
the virtualenv, reused afterwards) and run with the wheel's Node. The scripts it runs are
in `tests/support/ts_client/`; each takes the SDK's folder from LOCKGATE_TS_SDK."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.npm import npm_installed

ROOT = Path(__file__).resolve().parents[2]
TS_CLIENT = ROOT / "tests" / "support" / "ts_client"
#: Installed once per checkout, next to the virtualenv (`make clean` removes it).
TS_INSTALL = ROOT / ".venv" / "ts-client"
TS_SDK_VERSION = "1.32.2"


@pytest.fixture(name="ts_sdk", scope="session")
def ts_sdk_fixture() -> Path:
    """The official TypeScript SDK from the npm registry, pinned (`package.json`)."""
    return npm_installed(
        TS_CLIENT / "package.json", TS_INSTALL, "@modelcontextprotocol/sdk", TS_SDK_VERSION
    )
