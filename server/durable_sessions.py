"""The SDK's session manager, with sessions that outlive the process.

The SDK keeps 2025-protocol sessions in a dict and answers 404 for any id it does not hold,
so a restart (or another instance) would lose every session. This subclass keeps the SDK for
everything protocol and replaces only that lookup: an id the process does not hold, but whose
row is live, is revived — a new transport under the same id, driven by the SDK's own loop on
a connection whose initialize state is restored from the row, so the client needs no new
`initialize`. Unknown, expired or closed ids still get the SDK's 404.

Every session's transport gets its own replay log (`server/event_store.py`), never one
shared by all sessions: a Last-Event-ID can only ever replay the events of the session it
is sent on.

This is the one module that reaches into the SDK's private session bookkeeping
(`_server_instances`, `_session_owners`, `_session_creation_lock`, `_task_group`,
`_lifespan_state`, and the overridden `_handle_stateful_request`, `_admit_session`,
`_discard_session`, and the transport's `_mint_priming_event`). That is why `mcp` is pinned
to one version in pyproject.toml, and why tests/unit/test_sdk_contract.py fails, naming what
changed, when an upgrade moves any of it.
"""

from __future__ import annotations

import logging
from typing import Any
from uuid import uuid4

import anyio
from anyio import to_thread
from anyio.abc import TaskStatus
from mcp.server.auth.middleware.bearer_auth import AuthorizationContext
from mcp.server.connection import Connection
from mcp.server.runner import serve_connection
from mcp.server.streamable_http import (
    MCP_SESSION_ID_HEADER,
    SSEEvent,
    StreamableHTTPServerTransport,
    StreamId,
)
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.jsonrpc_dispatcher import JSONRPCDispatcher
from mcp.shared.transport_context import TransportContext
from mcp_types import ClientCapabilities, Implementation, InitializeRequestParams
from pydantic import ValidationError
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from lockgate.machine.db.schema import Session
from lockgate.machine.sessions import Sessions
from lockgate.server.event_store import ReplayLogs

log = logging.getLogger("lockgate.sessions")


def restored_params(row: Session) -> InitializeRequestParams:
    """The client's initialize parameters, as stored when the session opened."""
    try:
        info = Implementation.model_validate(row.client_info)
    except ValidationError:
        info = Implementation(name="unknown", version="0")
    try:
        capabilities = ClientCapabilities.model_validate(row.capabilities or {})
    except ValidationError:
        capabilities = ClientCapabilities()
    return InitializeRequestParams(
        protocol_version=row.protocol_version, capabilities=capabilities, client_info=info
    )


#: The version the SDK starts priming streams at; earlier sessions are primed as if they spoke
#: it (see `PrimingTransport`).
PRIMED_FROM = "2025-11-25"


class PrimingTransport(StreamableHTTPServerTransport):
    """The SDK's transport, priming every stream, whatever 2025 version the session speaks.

    The SDK writes a POST stream's priming event (an event id and `retry:`, no data) only
    from 2025-11-25, where the spec introduced it. Without one, a 2025-06-18 or 2025-03-26
    client whose stream breaks before the first message has no event id to resume from, so
    it can never collect the -32010 report for the request it lost. The clients people run
    (the TypeScript SDK 1.x, the Python SDK) accept a priming event on any version: they skip
    an event without data and keep its id and retry, which is all a priming event is.
    """

    async def _mint_priming_event(
        self, stream_id: StreamId, protocol_version: str
    ) -> SSEEvent | None:
        return await super()._mint_priming_event(stream_id, max(protocol_version, PRIMED_FROM))


class DurableSessionManager(StreamableHTTPSessionManager):
    def __init__(self, app: Any, sessions: Sessions, replay: ReplayLogs, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self.sessions = sessions
        self.replay = replay

    def _transport(self, session_id: str) -> StreamableHTTPServerTransport:
        return PrimingTransport(
            mcp_session_id=session_id,
            is_json_response_enabled=self.json_response,
            event_store=self.replay.for_session(session_id),
            security_settings=self.security_settings,
            retry_interval=self.retry_interval,
            idle_timeout=self.session_idle_timeout,
        )

    def _admit_session(
        self, requestor: AuthorizationContext | None
    ) -> StreamableHTTPServerTransport | None:
        """The SDK's admission, with the new session's own replay log (not a shared one)."""
        if self.max_sessions is not None and len(self._server_instances) >= self.max_sessions:
            return None
        transport = self._transport(uuid4().hex)
        session_id = transport.mcp_session_id
        assert session_id is not None
        if requestor is not None:
            self._session_owners[session_id] = requestor
        self._server_instances[session_id] = transport
        log.info("opened session %s", session_id)
        return transport

    async def _discard_session(
        self, session_id: str, transport: StreamableHTTPServerTransport
    ) -> None:
        await super()._discard_session(session_id, transport)
        if session_id not in self._server_instances:
            self.replay.discard(session_id)

    def held(self, session_id: str) -> bool:
        """Whether this process holds that session in memory (its transport is running)."""
        return session_id in self._server_instances

    def replayable(self, session_id: str, event_id: str) -> bool:
        """Whether this process can replay the events after `event_id` on that session."""
        if session_id not in self._server_instances:
            return False
        return self.replay.for_session(session_id).knows(event_id)

    async def _handle_stateful_request(self, scope: Scope, receive: Receive, send: Send) -> None:
        session_id = Request(scope, receive).headers.get(MCP_SESSION_ID_HEADER)
        if session_id is not None and session_id not in self._server_instances:
            row = await to_thread.run_sync(self.sessions.live, session_id)
            if row is not None:
                await self._revive(row)
        await super()._handle_stateful_request(scope, receive, send)

    async def _revive(self, row: Session) -> None:
        async with self._session_creation_lock:
            if row.id in self._server_instances:
                return  # revived by a concurrent request
            transport = self._transport(row.id)
            self._server_instances[row.id] = transport
            params = restored_params(row)

            async def run_server(
                *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
            ) -> None:
                async with transport.connect() as (read_stream, write_stream):
                    task_status.started()
                    try:
                        idle_scope = transport.idle_scope or anyio.CancelScope()
                        with idle_scope:
                            dispatcher: JSONRPCDispatcher[TransportContext] = JSONRPCDispatcher(
                                read_stream, write_stream, inline_methods=frozenset({"initialize"})
                            )
                            connection = Connection.for_loop(dispatcher, session_id=row.id)
                            # The handshake happened with an earlier incarnation: restore it.
                            connection.client_params = params
                            connection.protocol_version = row.protocol_version
                            connection.initialized.set()
                            await serve_connection(
                                self.app,
                                dispatcher,
                                connection=connection,
                                lifespan_state=self._lifespan_state,
                            )
                    except Exception:
                        log.exception("revived session %s crashed", row.id)
                    finally:
                        await self._discard_session(row.id, transport)

            assert self._task_group is not None
            await self._task_group.start(run_server)
            log.info("revived session %s from its row", row.id)
