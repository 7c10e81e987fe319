"""How the harness makes the session and owed_request lifecycles' events happen.

`SessionActions` drives sessions and the ledger of owed request ids as the HTTP session gate
drives them (the same `Sessions` methods, with the client's inbox): an `initialize` opens a
session, a tools/call is owed and then answered or lost on its stream, a collecting GET is
told what was lost, a DELETE closes the session, the process dies with a request in flight,
or the sessions idle past their timeout. The driver functions below choose the action for
one spec event; `tests.support.harness.DRIVERS` maps the events to them.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import TYPE_CHECKING

from sqlmodel import Session, select

from lockgate.machine.db.schema import Session as SessionRow
from lockgate.machine.lost_report import request_key
from lockgate.machine.runtime import Runtime
from lockgate.simulation.inbox import collect
from tests.support.lifecycle.choices import Choices, pick
from tests.support.lifecycle.client import Client
from tests.support.lifecycle.deployment import PRINCIPAL, Deployment
from tests.support.lifecycle.instance_drivers import InstanceActions
from tests.support.lifecycle.programs import CALLING_PROGRAMS

if TYPE_CHECKING:
    from tests.support.harness import Harness


class SessionActions:
    """The client's requests on its sessions, and the deaths and timeouts that end them."""

    def __init__(self, deployment: Deployment, client: Client, instances: InstanceActions) -> None:
        self.deployment = deployment
        self.client = client
        # A maintenance round is what sweeps sessions that idled past their timeout.
        self.instances = instances

    def live_sessions(self) -> list[str]:
        with Session(self.deployment.engine) as s:
            rows = {r.id: r.status for r in s.exec(select(SessionRow))}
        return [i for i in self.client.sessions if rows.get(i) in ("active", "idle")]

    def session(self, data: Choices, runtime: Runtime) -> str:
        """A live session of the client's (a new one, by an `initialize`, when none is live
        or the client picks a new one)."""
        live = self.live_sessions()
        if live and pick(data, [False, True], "a session of its own") is False:
            return pick(data, live, "session")

        def open_session() -> None:
            session_id = uuid.uuid4().hex
            self.client.sessions.append(session_id)
            runtime.sessions.open(session_id, PRINCIPAL, "2025-11-25", {"name": "h"}, {})
            runtime.sessions.end_request(session_id)

        self.deployment.act(runtime, open_session)
        live = self.live_sessions()
        return live[-1] if live else ""

    def request(self, data: Choices, *, answered: bool) -> None:
        """A tools/call on a session: owed, run, then answered (or its stream closes first
        and the id is lost)."""
        d, client = self.deployment, self.client
        runtime = d.pick_runtime(data)
        session_id = self.session(data, runtime)
        if not session_id:
            return
        program = pick(data, CALLING_PROGRAMS, "program")
        request_id = client.request_id()

        def call() -> None:
            sessions = runtime.sessions
            ledger = runtime.ledger
            client.inbox.sent(request_id)
            sessions.begin_request(session_id)
            owed = ledger.owe(session_id, request_id, "tools/call", None)
            d.note(f"{runtime.settings.instance_name}: {request_id} on {session_id[:8]}")
            if answered:
                view = runtime.engine.execute(
                    PRINCIPAL, program.code, session_id, request_key(session_id, request_id)
                )
                client.executions.setdefault(view.id, program)
                # The response is written (the client has it), then the entry is consumed.
                ledger.answered(owed, lambda: client.inbox.answer(request_id))
            else:
                ledger.lose(owed)  # the client's stream closed before the answer
            sessions.end_request(session_id)

        d.act(runtime, call)

    def collect(self, data: Choices) -> None:
        """The client's collecting GET on one of its sessions."""
        d = self.deployment
        live = self.live_sessions()
        if not live:
            return
        session_id = pick(data, live, "session")
        runtime = d.pick_runtime(data)
        d.note(f"{runtime.settings.instance_name}: GET on {session_id[:8]}")
        d.act(runtime, lambda: collect(self.client.inbox, runtime.ledger, session_id))

    def close_session(self, data: Choices, *, busy: bool = False) -> None:
        """DELETE on a session (with a request still in flight, when `busy`)."""
        d = self.deployment
        runtime = d.pick_runtime(data)
        session_id = self.session(data, runtime)
        if not session_id:
            return

        def close() -> None:
            owed = None
            if busy:
                runtime.sessions.begin_request(session_id)
                owed = runtime.ledger.owe(session_id, self.client.request_id(), "tools/call", None)
            d.note(f"{runtime.settings.instance_name}: DELETE {session_id[:8]}")
            runtime.sessions.close(session_id)
            if owed is not None:
                runtime.ledger.lose(owed)  # the request's stream ends with its session

        d.act(runtime, close)

    def set_log_level(self, data: Choices) -> None:
        """logging/setLevel on a session: within its request (active), or once another
        instance ended its last one (idle)."""
        d = self.deployment
        runtime = d.pick_runtime(data)
        session_id = self.session(data, runtime)
        if not session_id:
            return
        level = pick(data, ["debug", "warning", "error"], "level")
        within = pick(data, [True, False], "within a request")

        def set_level() -> None:
            d.note(f"{runtime.settings.instance_name}: logging/setLevel {level}")
            if within:
                runtime.sessions.begin_request(session_id)
            runtime.sessions.set_log_level(session_id, level)
            if within:
                runtime.sessions.end_request(session_id)

        d.act(runtime, set_level)

    def die_mid_request(self, data: Choices, *, after_close: bool = False) -> None:
        """The process dies with a request in flight (its session active, the id owed); the
        next incarnation's recovery releases the session and loses the id. With
        `after_close`, the client closed the session first: the lost id is abandoned."""
        d, client = self.deployment, self.client
        runtime = d.pick_runtime(data)
        session_id = self.session(data, runtime)
        if not session_id:
            return
        name = runtime.settings.instance_name

        def begin() -> None:
            request_id = client.request_id()
            client.inbox.sent(request_id)
            runtime.sessions.begin_request(session_id)
            runtime.ledger.owe(session_id, request_id, "tools/call", None)
            if after_close:
                runtime.sessions.close(session_id)

        if d.act(runtime, begin):
            d.note(f"{name}: dies with a request in flight")
            d.drop(runtime)
            d.boot(name)

    def expire_sessions(self, data: Choices) -> None:
        """Time passes beyond the sessions' idle timeout; a maintenance round sweeps."""
        runtime = self.deployment.pick_runtime(data)
        self.deployment.advance(runtime.sessions.policy.idle_timeout + timedelta(seconds=1))
        self.instances.heartbeat(data)


# -- the drivers -------------------------------------------------------------------------------


def session_request(h: Harness, data: Choices) -> None:
    h.sessions.request(data, answered=True)


def stream_closed(h: Harness, data: Choices) -> None:
    h.sessions.request(data, answered=False)


def report_lost(h: Harness, data: Choices) -> None:
    """A request lost on its stream, then the client's GET that is told so."""
    h.sessions.request(data, answered=False)
    h.sessions.collect(data)


def close_session(h: Harness, data: Choices) -> None:
    h.sessions.close_session(data, busy=pick(data, [False, True], "a request in flight"))


def abandon_reports(h: Harness, data: Choices) -> None:
    """A report nobody collected: its session is closed (or expires) first."""
    h.sessions.request(data, answered=False)
    if pick(data, ["close", "expire"], "how the session ends") == "close":
        h.sessions.close_session(data)
    else:
        h.sessions.expire_sessions(data)


def set_log_level(h: Harness, data: Choices) -> None:
    h.sessions.set_log_level(data)


def die_mid_request(h: Harness, data: Choices) -> None:
    h.sessions.die_mid_request(data)


def die_after_close(h: Harness, data: Choices) -> None:
    h.sessions.die_mid_request(data, after_close=True)


def expire_sessions(h: Harness, data: Choices) -> None:
    h.sessions.session(data, h.deployment.pick_runtime(data))
    h.sessions.expire_sessions(data)
