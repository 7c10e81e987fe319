"""Every 2025 session's POST stream is primed, so any of them can be resumed.

The SDK primes a stream (an event with an id and `retry:`, no data) only from 2025-11-25.
A 2025-06-18 or 2025-03-26 client whose stream broke before the first message would have
nothing to resume from, and so could never collect the -32010 report for what it lost.
Lockgate primes them all; here, for each version, over real HTTP into the real app: the
stream starts with the priming event carrying the configured retry, and its id is one the
server can resume from.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from lockgate.machine.runtime import Runtime
from lockgate.server.session_gate import SessionGate
from tests.support.servers import run
from tests.support.sessions import (
    URL,
    execute_request,
    headers,
    key_for,
    raw_initialize,
    serving,
)
from tests.support.sse import sse_messages

MakeRuntime = Callable[..., Runtime]

VERSIONS = ("2025-03-26", "2025-06-18", "2025-11-25")


@pytest.mark.parametrize("version", VERSIONS)
def test_a_post_stream_of_every_2025_version_starts_with_a_priming_event(
    make_runtime: MakeRuntime, version: str
) -> None:
    runtime = make_runtime(sse_retry_ms=7000)
    key = key_for(runtime, "alice")
    execute = execute_request(2, "6 * 7")

    async def scenario() -> None:
        async with serving(runtime) as (http, auth):
            gate = auth.app
            assert isinstance(gate, SessionGate)
            session_id = await raw_initialize(http, URL, key, version)
            sent = headers(key, session_id, **{"MCP-Protocol-Version": version})
            answer = await http.post(URL, headers=sent, json=execute)
            assert answer.status_code == 200, answer.text
            first = answer.text.replace("\r\n", "\n").split("\n\n")[0]
            fields = dict(line.partition(":")[::2] for line in first.split("\n"))
            fields = {name: value.strip() for name, value in fields.items()}
            # An id and a retry, and no message: a priming event.
            assert fields.keys() <= {"id", "retry", "data"} and not fields.get("data"), first
            assert fields["retry"] == "7000"
            [message] = sse_messages(answer.content)
            assert message["id"] == 2 and "42" in str(message["result"]), message

            # A client whose stream broke right after the priming event can resume from it:
            # this process replays that session's events after the id. (The end-to-end
            # resume, by real clients across a SIGKILL, is tests/test_clients_lost_request.py.)
            assert gate.replayable(session_id, fields["id"])
            assert not gate.replayable("another-session", fields["id"])

    run(scenario())
