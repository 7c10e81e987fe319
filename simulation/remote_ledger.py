"""The real-process drives of the session and ledger scenarios, over `SessionClient`.

Requests answered on a durable session, a request whose stream the client drops (its id
lost, then reported on the next collecting GET), a DELETE with a request in flight, and
sessions that expire in real time (the deployment's timeouts are seconds long; its sweep
runs every half second).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable

import httpx2

from lockgate.machine.db.audit_queries import AuditQueries
from lockgate.machine.db.session_queries import SessionQueries
from lockgate.simulation.held import held_code
from lockgate.simulation.real_process import ProcessKilled
from lockgate.simulation.remote_client import RemoteClient, wait
from lockgate.simulation.remote_session import SessionClient, SessionGone
from lockgate.simulation.world import ScenarioFailed, expect


def _session(client: RemoteClient) -> SessionClient:
    session: SessionClient = client.remember("session", lambda: SessionClient(client))
    if session.session_id is None:
        session.open()
    return session


def _request(client: RemoteClient, session: SessionClient, key: str, code: str) -> None:
    if client.memory.get(key):
        return
    attempt = client.memory.get(key + ".attempt", 0) + 1
    client.memory[key + ".attempt"] = attempt
    session.call(f"{key}-{attempt}", code)
    client.memory[key] = True


def session_requests(client: RemoteClient) -> None:
    session = _session(client)
    session.collect()
    _request(client, session, "r1", "tools.notes.list()")
    _request(client, session, "r2", "len(tools.notes.list())")
    session.collect()


def session_log_level(client: RemoteClient) -> None:
    """logging/setLevel twice on a session (each request makes it active): the last level
    set is the one its row keeps, through any restart between them."""
    session = _session(client)
    session.collect()  # what a crash cost the client is reported to it
    for level in ("error", "warning"):
        if client.memory.get(f"level.{level}"):
            continue
        attempt = client.memory.get(f"level.{level}.attempt", 0) + 1
        client.memory[f"level.{level}.attempt"] = attempt
        answer = session.set_log_level(f"level-{level}-{attempt}", level)
        expect(answer.get("result") == {}, f"logging/setLevel {level} answered {answer}")
        client.memory[f"level.{level}"] = True
    session.collect()
    row = SessionQueries(client.deployment.db).get(session.session_id or "")
    expect(
        row is not None and row.log_level == "warning",
        f"the session kept level {row.log_level if row else None!r}, not 'warning'",
    )


def stream_lost(client: RemoteClient) -> None:
    """The client's connection drops while its request runs: the id is lost (the stream
    closed abnormally) and reported on the session's next GET."""
    session = _session(client)
    if not client.memory.get("lost"):
        session.drop("s-1")
        client.memory["lost"] = True
    wait(client, lambda: _owed_settled_or_lost(client, "s-1"), "the dropped request is lost")
    session.collect()


def _owed_settled_or_lost(client: RemoteClient, request_id: str) -> bool:
    owed = AuditQueries(client.deployment.db).owed_requests()
    rows = [r for r in owed if str(r.request_id) == request_id]
    return bool(rows) and all(r.status != "owed" for r in rows)


def session_closed(client: RemoteClient) -> None:
    session = _session(client)
    if not client.memory.get("closed"):
        # A DELETE whose close committed before a crash took its answer is sent again after
        # the restart, and the session is by then closed: 404 is that DELETE's answer.
        again = client.memory.get("closing", False)
        client.memory["closing"] = True
        status = session.close()
        expect(
            status == 200 or (again and status == 404),
            f"DELETE on an idle session answered {status}",
        )
        client.memory["closed"] = True
    other: SessionClient = client.remember("other", lambda: SessionClient(client))
    if other.session_id is None:
        other.open()
    # The request stays in the held tool until the DELETE is answered, so it is in flight
    # when its session closes whatever the machine's load (simulation/held.py). The DELETE
    # goes once the request is owed: sent at once, it could reach the server first.
    busy = threading.Thread(target=_quietly(lambda: other.call("o-1", held_code())))
    busy.start()
    wait(client, lambda: _owed_in(client, other.session_id, "o-1"), "the request to be owed")
    status = other.close()
    client.deployment.release.touch()
    busy.join()
    expect(status in (200, 404), f"DELETE with a request in flight answered {status}")


def _owed_in(client: RemoteClient, session_id: str | None, request_id: str) -> bool:
    owed = AuditQueries(client.deployment.db).owed_requests()
    return any(r.session_id == session_id and str(r.request_id) == request_id for r in owed)


def _quietly(work: Callable[[], object]) -> Callable[[], None]:
    def run() -> None:
        # The request's fate is the ledger's; the invariants read it.
        with contextlib.suppress(SessionGone, ScenarioFailed, httpx2.HTTPError, ProcessKilled):
            work()

    return run


def _session_status(client: RemoteClient, session_id: str | None) -> str | None:
    row = SessionQueries(client.deployment.db).get(session_id) if session_id else None
    return row.status if row is not None else None


def session_expires(client: RemoteClient) -> None:
    """A session left idle expires once its idle timeout passes (the sweep runs every half
    second); its requests are then answered 404."""
    session = _session(client)
    wait(
        client,
        lambda: _session_status(client, session.session_id) == "expired",
        "the idle session expires",
    )
    try:
        session.call("late-1", "1")
    except SessionGone:
        return
    raise ScenarioFailed("a request on an expired session was served")


def session_lease(client: RemoteClient) -> None:
    """A lost report nobody collects ends uncollected when its session expires."""
    session = _session(client)
    if not client.memory.get("lost"):
        session.drop("b-1", sent=False)
        client.memory["lost"] = True
    wait(
        client,
        lambda: _session_status(client, session.session_id) == "expired",
        "the session with an uncollected report expires",
    )
