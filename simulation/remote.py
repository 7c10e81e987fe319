"""The scenario client over real interfaces, and the real-process drive of every scenario.

`RemoteClient` offers what a portable scenario's drive uses (execute, resume, get, memory)
through MCP over HTTP with the official client, one 2025 session per call, and reads each
execution's status exactly as the server states it (`executionStatus`). `SessionClient` is
one persistent session over raw HTTP, for the ledger: its POSTs, its collecting GET with
`Last-Event-ID`, its DELETE, and what it received (`simulation.inbox.Inbox`).

Scenarios that drive the engine directly in process (threads, gates, the simulated clock,
several instances) have a drive here that does the same thing to real processes: a stall is
a server that SIGSTOPs itself at a crash point (`LOCKGATE_STOP_AT`), a lease lapses in real
time (the deployment's leases are seconds long), instances are processes on one database.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from pydantic import JsonValue
from sqlmodel import Session, select

from machine.db.schema import Execution, Instance, OwedRequest, ToolCall
from machine.db.schema import Session as SessionRow
from machine.engine import Action
from machine.errors import LockgateError
from machine.execution_errors import (
    ExecutionAlreadySettled,
    ExecutionExpired,
    ExecutionInterrupted,
    ExecutionNotFound,
)
from machine.sessions import acknowledged_reports
from simulation.canary import LEAKING_CODE
from simulation.concurrency import STALLED_CODE
from simulation.inbox import Inbox
from simulation.real_process import Deployment, ProcessKilled, ServerProcess, until
from simulation.scenarios import (
    CATALOG,
    WRITE_THEN_READ,
    Scenario,
    by_name,
    decide,
    spin_code,
    started,
)
from simulation.world import ScenarioFailed, expect
from spec import CrashPoint
from spec import ExecutionStatus as E

PROTOCOL = "2025-11-25"
SETTLED = (E.COMPLETED, E.INTERRUPTED, E.FAILED)


@dataclass(frozen=True)
class RemoteView:
    """What a client learns of an execution from the MCP answers."""

    id: str
    status: E
    result: JsonValue = None
    error: JsonValue = None
    what_ran: JsonValue = None


_ERRORS: dict[str, Callable[[str, dict[str, Any], str], LockgateError]] = {
    "execution_not_found": lambda eid, e, s: ExecutionNotFound(execution_id=eid),
    "execution_expired": lambda eid, e, s: ExecutionExpired(execution_id=eid, deadline=None),
    "execution_already_settled": lambda eid, e, s: ExecutionAlreadySettled(
        execution_id=eid, status=s, detail="answered remotely"
    ),
    "execution_interrupted": lambda eid, e, s: ExecutionInterrupted(
        execution_id=eid, what_ran=e.get("what_ran")
    ),
}


class RemoteClient:
    """The scenario client against a deployment (its memory outlives every restart)."""

    def __init__(self, deployment: Deployment) -> None:
        self.deployment = deployment
        self.server = deployment.start("sim-a")
        self.principal = "sim"
        self.memory: dict[str, Any] = {}
        self.inbox = Inbox()

    def remember(self, key: str, compute: Any) -> Any:
        if key not in self.memory:
            self.memory[key] = compute()
        return self.memory[key]

    def call(
        self, tool: str, arguments: dict[str, Any], server: ServerProcess | None = None
    ) -> dict[str, Any]:
        """One tool call on a new 2025 session of `server` (the client's current one)."""
        target = server or self.server

        async def call() -> dict[str, Any]:
            headers = {"Authorization": f"Bearer {self.deployment.key}"}
            async with httpx2.AsyncClient(headers=headers, timeout=90) as http:
                transport = streamable_http_client(f"{target.url}/mcp", http_client=http)
                async with Client(transport, mode="legacy") as client:
                    result = await client.call_tool(tool, arguments)
                    return dict(result.structured_content or {})

        try:
            return asyncio.run(call())
        except BaseException as exc:  # the server died mid-request: a transport failure
            if _died(target):
                raise ProcessKilled(
                    f"{target.name} died ({target.proc.returncode})", target
                ) from exc
            raise

    def _view(
        self, tool: str, arguments: dict[str, Any], server: ServerProcess | None = None
    ) -> RemoteView:
        answer = self.call(tool, arguments, server)
        status = str(answer.get("status"))
        eid = str(answer.get("executionId", arguments.get("executionId", "")))
        exact = answer.get("executionStatus")
        error = answer.get("error")
        if status in _ERRORS:
            raise _ERRORS[status](eid, error if isinstance(error, dict) else {}, str(exact))
        if exact is None:
            raise ScenarioFailed(f"an answer without the execution's status: {answer}")
        return RemoteView(eid, E(str(exact)), answer.get("result"), error)

    def execute(self, code: str, server: ServerProcess | None = None) -> RemoteView:
        return self._view("execute", {"code": code}, server)

    def resume(
        self, execution_id: str, action: Action, server: ServerProcess | None = None
    ) -> RemoteView:
        return self._view("resume", {"executionId": execution_id, "action": str(action)}, server)

    def get(self, execution_id: str, server: ServerProcess | None = None) -> RemoteView:
        """The execution as it is, its status exactly as the server states it (final
        outcomes that `resume` answers as errors included)."""
        try:
            return self._view("resume", {"executionId": execution_id}, server)
        except ExecutionInterrupted as exc:
            return RemoteView(execution_id, E.INTERRUPTED, what_ran=exc.what_ran)
        except ExecutionExpired:
            return RemoteView(execution_id, E.EXPIRED)
        except ExecutionAlreadySettled as exc:
            return RemoteView(execution_id, E(exc.status))

    # -- the deployment's database, read as an operator would --------------------------------

    def execution_row(self, execution_id: str) -> Execution | None:
        with Session(self.deployment.db) as s:
            return s.get(Execution, execution_id)

    def instance_status(self, name: str) -> str | None:
        with Session(self.deployment.db) as s:
            rows = list(s.exec(select(Instance).where(Instance.name == name)))
        return max(rows, key=lambda r: r.incarnation).status if rows else None


def _died(server: ServerProcess) -> bool:
    try:
        server.proc.wait(timeout=5)
    except Exception:
        return False
    return True


# -- one persistent session over raw HTTP -------------------------------------------------------


class SessionClient:
    """A 2025 session over raw HTTP, as a client keeps one across restarts."""

    def __init__(self, client: RemoteClient) -> None:
        self.client = client
        self.session_id: str | None = None

    @property
    def inbox(self) -> Inbox:
        return self.client.inbox

    def _headers(self, accept: str = "application/json, text/event-stream") -> dict[str, str]:
        headers = {
            "Authorization": f"Bearer {self.client.deployment.key}",
            "Accept": accept,
            "MCP-Protocol-Version": PROTOCOL,
        }
        if self.session_id is not None:
            headers["Mcp-Session-Id"] = self.session_id
        return headers

    def _guard(self, work: Callable[[], Any]) -> Any:
        server = self.client.server
        try:
            return work()
        except httpx2.TransportError as exc:
            if _died(server):
                raise ProcessKilled(
                    f"{server.name} died ({server.proc.returncode})", server
                ) from exc
            raise

    def open(self) -> str:
        def initialize() -> str:
            message = {
                "jsonrpc": "2.0",
                "id": 0,
                "method": "initialize",
                "params": {
                    "protocolVersion": PROTOCOL,
                    "capabilities": {},
                    "clientInfo": {"name": "sim", "version": "1"},
                },
            }
            url = f"{self.client.server.url}/mcp"
            opened = httpx2.post(url, headers=self._headers(), json=message, timeout=30)
            opened.raise_for_status()
            self.session_id = opened.headers["mcp-session-id"]
            note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
            httpx2.post(url, headers=self._headers(), json=note, timeout=30)
            return self.session_id

        opened: str = self._guard(initialize)
        return opened

    def call(self, request_id: str, code: str) -> dict[str, Any]:
        """tools/call `execute` on the session; the answer (or -32010) for `request_id`."""
        self.inbox.sent(request_id)
        message = {
            "jsonrpc": "2.0",
            "id": request_id,
            "method": "tools/call",
            "params": {"name": "execute", "arguments": {"code": code}},
        }

        def post() -> dict[str, Any]:
            url = f"{self.client.server.url}/mcp"
            with httpx2.stream("POST", url, headers=self._headers(), json=message, timeout=90) as r:
                if r.status_code == 404:
                    raise SessionGone()
                for event_id, data in _events(r):
                    if isinstance(data, dict) and data.get("id") == request_id:
                        return self._received(event_id, data)
            raise ScenarioFailed(f"the stream of {request_id} ended without its answer")

        answer: dict[str, Any] = self._guard(post)
        return answer

    def _received(self, event_id: str | None, data: dict[str, Any]) -> dict[str, Any]:
        if "error" in data and data["error"].get("code") == -32010:
            acked = acknowledged_reports(event_id)
            self.inbox.lost(acked[1][-1] if acked else "", data)
        else:
            self.inbox.answer(str(data.get("id")))
        return data

    def drop(self, request_id: str, *, sent: bool = True) -> None:
        """tools/call with code that runs a while; the client goes away after the first
        bytes of the stream (its priming event). `sent`: the client counts the request as
        its own (it then expects its -32010)."""
        if sent:
            self.inbox.sent(request_id)
        message = {
            "jsonrpc": "2.0",
            "id": request_id,
            "method": "tools/call",
            "params": {"name": "execute", "arguments": {"code": _compute(3_000_000)}},
        }

        def abandon() -> None:
            url = f"{self.client.server.url}/mcp"
            with httpx2.stream("POST", url, headers=self._headers(), json=message, timeout=30) as r:
                for _ in r.iter_bytes():
                    break

        self._guard(abandon)

    def collect(self) -> None:
        """The collecting GET: acknowledges what it read last, reads the reports written."""

        def get() -> None:
            headers = self._headers("text/event-stream")
            if self.inbox.last_event_id is not None:
                headers["Last-Event-ID"] = self.inbox.last_event_id
                acked = acknowledged_reports(self.inbox.last_event_id)
                if acked is not None:
                    self.inbox.acknowledged.update(acked[1])
            url = f"{self.client.server.url}/mcp"
            with httpx2.stream(
                "GET", url, headers=headers, timeout=httpx2.Timeout(30, read=3)
            ) as r:
                if r.status_code != 200:
                    return
                try:
                    for event_id, data in _events(r):
                        if isinstance(data, dict) and "error" in data:
                            self._received(event_id, data)
                            self.inbox.last_event_id = event_id
                except httpx2.ReadTimeout:
                    return  # the listening stream: nothing (more) to report

        self._guard(get)

    def close(self) -> int:
        def delete() -> int:
            url = f"{self.client.server.url}/mcp"
            return httpx2.delete(url, headers=self._headers(), timeout=30).status_code

        status: int = self._guard(delete)
        return status


class SessionGone(Exception):
    """The session's requests are answered 404: it expired or was closed."""


def _events(response: httpx2.Response) -> Any:
    """(event id, parsed data) for each SSE event of a streamed response (or the JSON body)."""
    if not response.headers.get("content-type", "").startswith("text/event-stream"):
        body = response.read()
        if body.strip():
            yield None, json.loads(body)
        return
    event_id: str | None = None
    data: list[str] = []
    for line in response.iter_lines():
        if line.startswith("id:"):
            event_id = line[3:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].lstrip())
        elif line == "":
            text = "\n".join(data).strip()
            if text:  # a priming event has an id and no data
                yield event_id, json.loads(text)
            event_id, data = None, []


# -- the real-process drives -------------------------------------------------------------------

RemoteDrive = Callable[[RemoteClient], None]


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


def stream_lost(client: RemoteClient) -> None:
    """The client's connection drops while its request runs: the id is lost (the stream
    closed abnormally) and reported on the session's next GET."""
    session = _session(client)
    if not client.memory.get("lost"):
        session.drop("s-1")
        client.memory["lost"] = True
    _wait(client, lambda: _owed_settled_or_lost(client, "s-1"), "the dropped request is lost")
    session.collect()


def _wait(client: RemoteClient, condition: Callable[[], bool], what: str) -> None:
    """`until`, noticing a server that died meanwhile (its maintenance loop reached the
    armed point while the client waited): the run restarts it, as its supervisor would."""

    def alive_and(condition: Callable[[], bool] = condition) -> bool:
        client.deployment.check_alive()
        return condition()

    until(alive_and, what)


def _owed_settled_or_lost(client: RemoteClient, request_id: str) -> bool:
    with Session(client.deployment.db) as s:
        rows = [r for r in s.exec(select(OwedRequest)) if str(r.request_id) == request_id]
    return bool(rows) and all(r.status != "owed" for r in rows)


def _compute(iterations: int) -> str:
    return f"total = 0\nfor i in range({iterations}):\n    total = total + i\ntotal"


def session_closed(client: RemoteClient) -> None:
    session = _session(client)
    if not client.memory.get("closed"):
        expect(session.close() == 200, "DELETE on an idle session was not answered 200")
        client.memory["closed"] = True
    other: SessionClient = client.remember("other", lambda: SessionClient(client))
    if other.session_id is None:
        other.open()
    busy = threading.Thread(target=_quietly(lambda: other.call("o-1", _compute(500_000))))
    busy.start()
    status = other.close()
    busy.join()
    expect(status in (200, 404), f"DELETE with a request in flight answered {status}")


def _quietly(work: Callable[[], object]) -> Callable[[], None]:
    def run() -> None:
        # The request's fate is the ledger's; the invariants read it.
        with contextlib.suppress(SessionGone, ScenarioFailed, httpx2.HTTPError, ProcessKilled):
            work()

    return run


def _session_status(client: RemoteClient, session_id: str | None) -> str | None:
    with Session(client.deployment.db) as s:
        row = s.get(SessionRow, session_id) if session_id else None
    return row.status if row is not None else None


def session_expires(client: RemoteClient) -> None:
    """A session left idle expires once its idle timeout passes (the sweep runs every half
    second); its requests are then answered 404."""
    session = _session(client)
    _wait(
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
    _wait(
        client,
        lambda: _session_status(client, session.session_id) == "expired",
        "the session with an uncollected report expires",
    )


def approval_expires(client: RemoteClient) -> None:
    """A paused execution waits until its deadline (two seconds here), then expires; a late
    decision is refused."""
    view = started(client, "e", WRITE_THEN_READ)  # type: ignore[arg-type]
    row = client.execution_row(view.id)
    deadline = row.deadline if row is not None else None
    expect(deadline is not None, "a paused execution has no deadline")
    _wait(client, lambda: _stored_status(client, view.id) == E.EXPIRED, "the approval expires")
    expect(client.get(view.id).status == E.EXPIRED, "the expired execution is read otherwise")
    after = decide(client, "e.id", Action.ACCEPT)  # type: ignore[arg-type]
    expect(after is not None and after.status == E.EXPIRED, f"a late decision gave {after}")


def resume_after_restart(client: RemoteClient) -> None:
    started(client, "e", WRITE_THEN_READ)  # type: ignore[arg-type]
    if not client.memory.get("restarted"):
        _graceful_restart(client)
        client.memory["restarted"] = True
    view = decide(client, "e.id", Action.ACCEPT)  # type: ignore[arg-type]
    expect(
        view is not None and view.status in (E.COMPLETED, E.INTERRUPTED), f"after restart: {view}"
    )


def _graceful_restart(client: RemoteClient) -> None:
    server = client.server
    status = client.deployment.stop(server)
    expect(status == 0, f"SIGTERM ended {server.name} with status {status}")
    client.server = client.deployment.start(server.name)


def graceful_shutdown(client: RemoteClient) -> None:
    started(client, "e", "tools.notes.list()")  # type: ignore[arg-type]
    if not client.memory.get("closed"):
        _graceful_restart(client)
        client.memory["closed"] = True


#: About three seconds of pure code after a call: long enough to SIGTERM it mid-run.
REMOTE_SPIN_ITERATIONS = 30_000_000
REMOTE_SPIN_CODE = spin_code(REMOTE_SPIN_ITERATIONS)
#: What a stop may take beyond the drain's bound (the app's shutdown, the interpreter's exit).
STOP_MARGIN_SECS = 3.0


def _spin_ids(client: RemoteClient) -> list[str]:
    with Session(client.deployment.db) as s:
        rows = s.exec(select(Execution.id).where(Execution.code == REMOTE_SPIN_CODE))
        return list(rows)


def _spinning(client: RemoteClient) -> bool:
    """A spinning execution is past its first call (the code after it runs)."""
    with Session(client.deployment.db) as s:
        for execution_id in _spin_ids(client):
            row, call = s.get(Execution, execution_id), s.get(ToolCall, f"{execution_id}:1")
            running = row is not None and row.status == E.RUNNING
            if running and call is not None and call.status == "succeeded":
                return True
    return False


def drain_while_running(client: RemoteClient) -> None:
    """SIGTERM while code runs past its first call: the server exits 0 within its drain
    bound, its execution handed back; the server started again under the same name runs it
    to its result, which the client then reads."""
    if not client.memory.get("draining"):
        server = client.server

        def execute() -> None:
            # Cut off by the drain (-32010, or the connection closing): the invariants judge
            # the ledger; the client finds its execution by the code it sent.
            with contextlib.suppress(Exception):
                client.execute(REMOTE_SPIN_CODE, server)

        worker = threading.Thread(target=execute, name="spin", daemon=True)
        worker.start()
        try:
            _wait(client, lambda: _spinning(client), "the code runs past its first call")
            client.memory["draining"] = True  # a death from here on is the drain's
            began = time.monotonic()
            status = client.deployment.stop(server)
            took = time.monotonic() - began
        finally:
            worker.join()
        bound = float(by_name("drain_while_running").real_process_settings["drain_timeout"])
        expect(status == 0, f"SIGTERM ended {server.name} with status {status}")
        expect(took < bound + STOP_MARGIN_SECS, f"the stop took {took:.1f} s (bound {bound:g} s)")
        client.server = client.deployment.start(server.name)
    for execution_id in _spin_ids(client):
        _wait(client, _settles(client, execution_id), "the drained execution settles")
        final = client.get(execution_id)
        expect(
            final.status == E.COMPLETED and final.result == REMOTE_SPIN_ITERATIONS,
            f"the drained execution ended {final.status} with {final.result!r}",
        )


def _settles(client: RemoteClient, execution_id: str) -> Callable[[], bool]:
    return lambda: _stored_status(client, execution_id) in SETTLED


def _other(client: RemoteClient, name: str) -> ServerProcess:
    server = client.deployment.servers.get(name)
    if server is None or server.proc.poll() is not None:
        server = client.deployment.start(name)
    return server


def stalled(
    point_name: str, *, recoverers: tuple[str, ...] = ("sim-b",), kill: bool = False
) -> RemoteDrive:
    """a stops itself at `point_name` mid-run (SIGSTOP: no heartbeat, its lease lapses);
    the other instances declare it dead and recover its execution; then a is resumed
    (SIGCONT) and goes on with what it read before, or (`kill`) never comes back."""
    point = CrashPoint.parse(point_name)

    def drive(client: RemoteClient) -> None:
        others = [_other(client, name) for name in recoverers]
        if client.memory.get("stall.done"):
            _settled(client, others[0])
            return
        a = client.server
        if "stall.started" not in client.memory:
            client.deployment.stop(a)
            client.memory["stall.started"] = True
            a = client.server = client.deployment.start(a.name, stop_at=point)
        answers: list[RemoteView] = []
        crashed: list[ProcessKilled] = []

        def run() -> None:
            try:
                answers.append(client.execute(STALLED_CODE, a))
            except ProcessKilled as killed:
                crashed.append(killed)
            except (LockgateError, ScenarioFailed, httpx2.HTTPError):
                pass  # a's answer after the stall: whatever it is, the invariants judge

        worker = threading.Thread(target=run)
        worker.start()
        killed = False
        try:
            until(
                lambda: a.stopped or not worker.is_alive() or _dead_other(client, a),
                f"{a.name} stops at {point.name}",
            )
            if a.stopped:
                until(
                    lambda: client.instance_status(a.name) == "dead" or _dead_other(client, a),
                    f"{a.name} is declared dead",
                )
                client.deployment.check_alive_except(a)
        finally:
            killed = a.stopped and kill
            if killed:
                a.kill()
                client.deployment.died(a, deliberate=True)
            elif a.stopped:
                a.resume()
            worker.join()
        if crashed and not killed:  # a died of its crash point, not of the harness's kill
            raise crashed[0]
        if answers:
            client.memory["e"] = answers[0].id
        client.memory["stall.done"] = True
        if killed:
            client.server = client.deployment.start(a.name)
        _settled(client, others[0])

    return drive


def _stored_status(client: RemoteClient, execution_id: str) -> str | None:
    """Polled in the database, as an operator would (polling through MCP would open a
    session per look, and the principal's request rate is bounded)."""
    row = client.execution_row(execution_id)
    return row.status if row is not None else None


def _dead_other(client: RemoteClient, stalled: ServerProcess) -> bool:
    return any(
        s.proc.poll() is not None for s in client.deployment.servers.values() if s is not stalled
    )


def _settled(client: RemoteClient, server: ServerProcess) -> None:
    execution_id = client.memory.get("e")
    if execution_id is None:
        return
    until(
        lambda: _stored_status(client, execution_id) in SETTLED or _dead_other(client, server),
        "the stalled instance's execution settles",
    )
    client.deployment.check_alive()
    final = client.get(execution_id, server)  # and the client is told exactly that
    expect(final.status in SETTLED, f"the stalled instance's execution is {final.status}")


def one_decision_twice(client: RemoteClient) -> None:
    b = _other(client, "sim-b")
    view = started(client, "e", WRITE_THEN_READ)  # type: ignore[arg-type]
    failures: list[BaseException] = []

    def resume(server: ServerProcess) -> Callable[[], None]:
        def run() -> None:
            try:
                client.resume(view.id, Action.ACCEPT, server)
            except LockgateError:
                pass  # already decided by the other: a legitimate answer
            except BaseException as exc:
                failures.append(exc)

        return run

    if not client.memory.get("decided"):
        threads = [threading.Thread(target=resume(s)) for s in (client.server, b)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if failures:
            raise failures[0]
        client.memory["decided"] = True
    final = client.get(view.id, b)
    expect(final.status in (E.COMPLETED, E.INTERRUPTED), f"decided twice: {final.status}")


def leaky_tools(client: RemoteClient) -> None:
    view = started(client, "e", LEAKING_CODE)  # type: ignore[arg-type]
    final = client.get(view.id)
    expect(final.status in (E.COMPLETED, E.INTERRUPTED), f"leaky tools ended {final.status}")


#: The real-process drive of each scenario that cannot use its in-process one.
REMOTE: dict[str, RemoteDrive] = {
    "leaky_tools": leaky_tools,
    "approval_expired": approval_expires,
    "approval_deadline": approval_expires,
    "resume_after_restart": resume_after_restart,
    "lease_takeover": stalled("tool_call:dispatch:approved->dispatched:before_commit", kill=True),
    "instance_lease": stalled("tool_call:dispatch:approved->dispatched:before_commit"),
    "graceful_shutdown": graceful_shutdown,
    "drain_while_running": drain_while_running,
    "stalled_before_dispatch": stalled("tool_call:dispatch:approved->dispatched:before_commit"),
    "stalled_after_dispatch": stalled("tool_call:dispatch:approved->dispatched:after_commit"),
    "stalled_before_succeed": stalled("tool_call:succeed:dispatched->succeeded:before_commit"),
    "stalled_before_complete": stalled("execution:complete:running->completed:before_commit"),
    "two_recoverers": stalled(
        "tool_call:dispatch:approved->dispatched:before_commit", recoverers=("sim-b", "sim-c")
    ),
    # For real, the window is the stall race itself (the way it was found, under load):
    # b's read and commit are not held apart, so the drive is the stall before a dispatch.
    "woken_before_recovery_commits": stalled(
        "tool_call:dispatch:approved->dispatched:before_commit"
    ),
    "one_decision_twice": one_decision_twice,
    "session_requests": session_requests,
    "stream_lost": stream_lost,
    "session_closed": session_closed,
    "session_idle": session_expires,
    "session_cap": session_expires,
    "session_lease": session_lease,
}

#: Scenarios with several server processes at once: they need a database server. On SQLite
#: one process's open transaction (a stalled one's, for minutes) locks every other out of the
#: file, which is why the README runs several instances on PostgreSQL only.
SEVERAL_INSTANCES = frozenset(
    {
        "lease_takeover",
        "instance_lease",
        "stalled_before_dispatch",
        "stalled_after_dispatch",
        "stalled_before_succeed",
        "stalled_before_complete",
        "two_recoverers",
        "woken_before_recovery_commits",
        "one_decision_twice",
    }
)

#: Scenarios no real interface can drive, and why.
NO_CLIENT_DOOR = {
    "execution_cancelled": "no client interface cancels a whole execution (only the engine "
    "does, in process); a decision of `cancel` is approval_cancelled",
}


def remote_drive(scenario: Scenario) -> RemoteDrive:
    if scenario.name in REMOTE:
        return REMOTE[scenario.name]
    if scenario.portable:
        drive = scenario.drive
        return lambda client: drive(client)  # type: ignore[arg-type]
    raise KeyError(f"scenario {scenario.name!r} has no real-process drive")


def runnable() -> list[Scenario]:
    return [s for s in CATALOG if s.name not in NO_CLIENT_DOOR]
