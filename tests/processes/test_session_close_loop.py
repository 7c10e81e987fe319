"""After a 200 to DELETE, no request on that session id is ever served again: four hundred
sessions opened, used and closed over real HTTP against a `lockgate serve` process, and two
hundred more by the official TypeScript SDK client's `terminateSession()`.

The loop is the one that found the race: initialize, ping, DELETE, ping. The DELETE arrives
while the ping's own bookkeeping (the session's end of request) may still be writing; a
close that lost that write race used to leave the row live, and the next request revived
it (3 of 200 raw, about half of the TypeScript runs).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path

import httpx2
import pytest

from tests.support.npm import NODE
from tests.support.servers import (  # noqa: F401  (fixture: deployment)
    Deployment,
    create_key_directly,
    deployment_fixture,
    run,
)
from tests.support.sessions import database, headers, raw_initialize
from tests.support.typescript_sdk import TS_CLIENT, ts_sdk_fixture  # noqa: F401  (fixture)

pytestmark = pytest.mark.slow

PING = {"jsonrpc": "2.0", "id": 2, "method": "ping"}


def test_closed_sessions_stay_closed(deployment: Deployment) -> None:
    # Four hundred on the embedded default (the race this loop found lost 3 closes in 200:
    # about 6 expected here); two hundred on PostgreSQL, whose close is the same write path
    # (the row's version decides) and which costs as much again per iteration.
    iterations = 200 if deployment.database_url.startswith("postgresql") else 400
    key = create_key_directly(deployment.database_url, "alice")
    # 1,600 requests in well under a minute: above the default per-principal rate.
    server = deployment.start(name="closing", LOCKGATE_MAX_REQUESTS_PER_MINUTE="100000")

    async def scenario() -> tuple[list[str], list[tuple[int, int]]]:
        opened: list[str] = []
        revived: list[tuple[int, int]] = []
        async with httpx2.AsyncClient(timeout=30) as http:
            for i in range(iterations):
                session_id = await raw_initialize(http, server.url, key)
                opened.append(session_id)
                used = await http.post(server.url, headers=headers(key, session_id), json=PING)
                assert used.status_code == 200, used.text
                closed = await http.delete(server.url, headers=headers(key, session_id))
                assert closed.status_code == 200, closed.text
                after = await http.post(server.url, headers=headers(key, session_id), json=PING)
                if after.status_code != 404:
                    revived.append((i, after.status_code))
        return opened, revived

    opened, revived = run(scenario())
    served = f"{len(revived)} of {iterations} closed sessions served a request: {revived}"
    assert revived == [], served
    with database(deployment.database_url) as db:
        assert {db.session(s).status for s in opened} == {"closed"}


def test_sessions_closed_by_the_typescript_client_stay_closed(
    deployment: Deployment,
    ts_sdk: Path,
) -> None:
    key = create_key_directly(deployment.database_url, "alice")
    server = deployment.start(name="closing")

    async def scenario() -> dict[str, object]:
        process = await asyncio.create_subprocess_exec(
            str(NODE),
            str(TS_CLIENT / "close_loop.mjs"),
            server.url,
            key,
            "200",
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, "LOCKGATE_TS_SDK": str(ts_sdk)},
        )
        out, err = await asyncio.wait_for(process.communicate(), 300)
        assert process.returncode == 0, err.decode()
        [line] = [x for x in out.decode().splitlines() if x.startswith("{")]
        loaded: dict[str, object] = json.loads(line)
        return loaded

    outcome = run(scenario())
    assert outcome["closed"] == 200, outcome
    assert outcome["revived"] == [], outcome
