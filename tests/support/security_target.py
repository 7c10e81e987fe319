"""The server the security tests (tests/test_security*.py) attack: a real `lockgate serve` on
a SQLite database of its own, with keys for two principals, alice and bob (`Target`,
`start_target`), and the headers of a legacy-era MCP request.

Also a pytest plugin: `target`, one such server per test module, with a small request-body
limit (`MAX_BODY`), a short key recheck and /metrics behind a key; and `http`, a client per
test. Test modules name it in `pytest_plugins`; they import helpers from here before pytest
registers the plugin, hence PYTEST_DONT_REWRITE (pytest would warn that this module was
imported before it could rewrite its asserts).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest

from tests.support.servers import ACCEPT, SharedServer, create_key_directly, make_deployment

#: Small enough that the body-limit tests are cheap, large enough for every honest request.
MAX_BODY = 65536


Target = SharedServer


def start_target(directory: Path, **settings: str) -> Target:
    deployment = make_deployment(f"sqlite:///{directory / 'lockgate.db'}", directory, **settings)
    alice = create_key_directly(deployment.database_url, "alice")
    bob = create_key_directly(deployment.database_url, "bob")
    return Target(deployment, deployment.start(), alice, bob)


@pytest.fixture(name="target", scope="module")
def target_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    made = start_target(
        tmp_path_factory.mktemp("security"),
        LOCKGATE_MAX_REQUEST_BYTES=str(MAX_BODY),
        LOCKGATE_KEY_RECHECK_SECS="0.3",
        LOCKGATE_METRICS_REQUIRE_KEY="true",
        # The fuzz sends many requests; the rate limit has a test (and a server) of its own.
        LOCKGATE_MAX_REQUESTS_PER_MINUTE="100000",
    )
    try:
        yield made
    finally:
        made.deployment.stop_all()


@pytest.fixture(name="http")
def http_fixture() -> Iterator[httpx2.Client]:
    with httpx2.Client(timeout=30.0) as client:
        yield client


def legacy_headers(key: str, session_id: str | None = None, **extra: str) -> dict[str, str]:
    headers = {"Authorization": f"Bearer {key}", **ACCEPT, "MCP-Protocol-Version": "2025-11-25"}
    if session_id is not None:
        headers["Mcp-Session-Id"] = session_id
    headers.update(extra)
    return headers
