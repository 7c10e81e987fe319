"""The drives of sessions and the owed-request ledger, driven in process as the HTTP session
gate drives them: requests owed and answered, a stream lost and its id reported, sessions
closed and expired.

What the client received is its `Inbox`, kept in its memory so it outlives every crash.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

from lockgate.machine.lost_report import request_key
from lockgate.simulation.inbox import Inbox, collect
from lockgate.simulation.world import Client, expect


def _session(client: Client) -> str:
    """A session opened by an `initialize` this client sent once."""
    sessions = client.runtime.sessions

    def open_session() -> str:
        session_id = uuid.uuid4().hex
        sessions.open(
            session_id, client.principal, "2025-11-25", {"name": "sim", "version": "1"}, {}
        )
        return session_id

    session_id: str = client.remember("session", open_session)
    if not client.memory.get("initialized"):
        sessions.end_request(session_id)  # the initialize exchange is over
        client.memory["initialized"] = True
    return session_id


def inbox_of(client: Client) -> Inbox:
    """What the client received on its sessions (its memory: it outlives every crash)."""
    inbox: Inbox = client.remember("inbox", Inbox)
    return inbox


def _collect_reports(client: Client, session_id: str, stream: str | None = None) -> None:
    """The client's collecting GET on its session after a restart: lost ids are reported
    to it, once (it acknowledges what it read when it opens the GET again)."""
    collect(inbox_of(client), client.runtime.ledger, session_id, stream)


def _request(client: Client, session_id: str, key: str, code: str) -> None:
    """One tools/call on the session: owed, run, answered (once; a retry after a crash is a
    new request id, as a client would send)."""
    if client.memory.get(key):
        return
    sessions = client.runtime.sessions
    ledger = client.runtime.ledger
    attempt = client.memory.get(key + ".attempt", 0) + 1
    client.memory[key + ".attempt"] = attempt
    request_id = f"{key}-{attempt}"
    inbox_of(client).sent(request_id)
    # As the HTTP gate does: the request's check reads the session, and its bookkeeping
    # goes on from that row.
    sessions.begin_request(session_id, sessions.live(session_id))
    owed = ledger.owe(session_id, request_id, "tools/call", None)
    client.runtime.engine.execute(
        client.principal, code, session_id, request_key(session_id, request_id)
    )
    # The response is written (the client has it), then the entry is consumed.
    ledger.answered(owed, lambda: inbox_of(client).answer(request_id))
    sessions.end_request(session_id)
    client.memory[key] = True


def session_requests(client: Client) -> None:
    session_id = _session(client)
    _collect_reports(client, session_id)
    _request(client, session_id, "r1", "tools.notes.list()")
    _request(client, session_id, "r2", "len(tools.notes.list())")
    _collect_reports(client, session_id)


def session_closed(client: Client) -> None:
    """DELETE while a request is in flight (active), then on an idle session."""
    session_id = _session(client)
    sessions = client.runtime.sessions
    if not client.memory.get("closed"):
        sessions.begin_request(session_id)
        sessions.close(session_id)
        client.memory["closed"] = True
    other = client.remember("other", lambda: _fresh_session(client))
    sessions.close(other)


def _fresh_session(client: Client) -> str:
    session_id = uuid.uuid4().hex
    sessions = client.runtime.sessions
    sessions.open(session_id, client.principal, "2025-11-25", {"name": "sim", "version": "1"}, {})
    sessions.end_request(session_id)
    return session_id


def stream_lost(client: Client) -> None:
    """A stream ends without the answer: the id is lost, and reported on the same stream."""
    session_id = _session(client)
    sessions = client.runtime.sessions
    ledger = client.runtime.ledger
    inbox = inbox_of(client)
    if not client.memory.get("lost"):
        inbox.sent("s-1")
        sessions.begin_request(session_id)
        owed = ledger.owe(session_id, "s-1", "tools/call", None)
        ledger.lose(owed)
        row = ledger.get(owed.id)
        assert row is not None
        inbox.lost(owed.id, ledger.lost_error(row))  # written on the request's own stream
        ledger.reported(owed)
        sessions.end_request(session_id)
        client.memory["lost"] = True
    _collect_reports(client, session_id)


def session_lease(client: Client) -> None:
    """Leases: an idle session is destroyed; one with a request in flight too, past the cap;
    a lost report nobody collects ends uncollected with its session."""
    idle = _session(client)
    busy = client.remember("busy", lambda: _fresh_session(client))
    sessions = client.runtime.sessions
    ledger = client.runtime.ledger
    if not client.memory.get("busy.begun"):
        sessions.begin_request(busy)
        owed = ledger.owe(busy, "b-1", "tools/call", None)
        ledger.lose(owed)  # nobody will collect this one
        client.memory["busy.begun"] = True
    client.world.clock.advance(timedelta(minutes=20))  # past the idle timeout and the cap
    client.runtime.maintain()
    for session_id in (idle, busy):
        row = sessions.get(session_id)
        expect(
            row is not None and row.status == "expired", f"session {session_id} outlived its lease"
        )


def session_log_level(client: Client) -> None:
    """logging/setLevel while a request is in flight (active), then while idle (another
    instance ended its last request): the last level set is the one kept."""
    session_id = _session(client)
    sessions = client.runtime.sessions
    if not client.memory.get("level.error"):
        sessions.begin_request(session_id)
        expect(sessions.set_log_level(session_id, "error"), "a live session refused a level")
        sessions.end_request(session_id)
        client.memory["level.error"] = True
    if not client.memory.get("level.warning"):
        expect(sessions.set_log_level(session_id, "warning"), "an idle session refused a level")
        client.memory["level.warning"] = True
    row = sessions.get(session_id)
    expect(
        row is not None and row.log_level == "warning",
        f"session {session_id} kept level {row.log_level if row else None!r}, not 'warning'",
    )
