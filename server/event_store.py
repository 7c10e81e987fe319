"""SSE replay logs: resumable streams within one process, one log per session, bounded in bytes.

Every event a session's streams carry gets an id, so a client whose stream breaks reconnects
with Last-Event-ID and receives what it missed. Three rules keep this from becoming a way to
read someone else's answers, or to exhaust memory:

- **Each session has its own log.** The SDK transport of a session is handed that session's
  log only, so a Last-Event-ID is looked up among the events of the session the request
  belongs to (which the session gate has already checked is the caller's). An id from any
  other session is simply unknown there.
- **Ids are unguessable.** `<stream>:<128 random bits>`: the stream part (the request id the
  client chose) tells the ledger which request a reconnect is about; the random part means
  knowing one id says nothing about the next.
- **Memory is bounded in bytes**, per session and in total. Events are kept as the JSON the
  client was sent (what the SDK writes on the wire), so the bound is what is really held;
  the oldest events are dropped first, and an event larger than a session's whole budget is
  not kept at all (it is still delivered live; it just cannot be replayed).

After a restart nothing is here: the owed-request ledger answers the reconnecting client.
"""

from __future__ import annotations

import secrets
import threading
from collections import OrderedDict
from dataclasses import dataclass

from mcp.server.streamable_http import EventCallback, EventId, EventMessage, EventStore, StreamId
from mcp_types import JSONRPCMessage, jsonrpc_message_adapter

#: Bytes counted for an event besides its JSON (its id, stream and bookkeeping), so that a
#: flood of tiny events is bounded too.
EVENT_OVERHEAD = 200


@dataclass(frozen=True)
class _Event:
    session_id: str
    stream_id: StreamId
    #: The message as sent on the wire; None for a priming event (no message).
    data: bytes | None

    @property
    def size(self) -> int:
        return EVENT_OVERHEAD + len(self.stream_id) + (len(self.data) if self.data else 0)


class ReplayLogs:
    """Every session's replay log, within `per_session_bytes` each and `total_bytes` all."""

    def __init__(self, *, per_session_bytes: int, total_bytes: int) -> None:
        self.per_session_bytes = per_session_bytes
        self.total_bytes = total_bytes
        #: Every kept event, oldest first, across sessions (for the total bound).
        self._all: OrderedDict[str, _Event] = OrderedDict()
        self._sessions: dict[str, SessionReplayLog] = {}
        self._total = 0
        # Transports of different sessions store events from different tasks; the
        # bookkeeping is a few dict operations, so one lock for all is enough.
        self._lock = threading.Lock()

    @property
    def bytes_held(self) -> int:
        return self._total

    def for_session(self, session_id: str) -> SessionReplayLog:
        with self._lock:
            log = self._sessions.get(session_id)
            if log is None:
                log = self._sessions[session_id] = SessionReplayLog(self, session_id)
            return log

    def discard(self, session_id: str) -> None:
        """Forget a session's events (it ended, or its transport left this process)."""
        with self._lock:
            log = self._sessions.pop(session_id, None)
            if log is None:
                return
            for event_id in list(log.events):
                self._drop(event_id)

    def _keep(self, event_id: str, event: _Event) -> None:
        with self._lock:
            log = self._sessions.get(event.session_id)
            if log is None or event.size > self.per_session_bytes:
                return
            log.events[event_id] = event
            log.size += event.size
            self._all[event_id] = event
            self._total += event.size
            while log.size > self.per_session_bytes:
                self._drop(next(iter(log.events)))
            while self._total > self.total_bytes:
                self._drop(next(iter(self._all)))

    def _drop(self, event_id: str) -> None:
        event = self._all.pop(event_id)
        self._total -= event.size
        log = self._sessions.get(event.session_id)
        if log is not None and log.events.pop(event_id, None) is not None:
            log.size -= event.size

    def _after(self, session_id: str, event_id: str) -> tuple[StreamId, list[tuple[str, bytes]]]:
        """The stream of `event_id` and that stream's messages after it, in this session."""
        with self._lock:
            log = self._sessions[session_id]
            stream_id = log.events[event_id].stream_id
            later: list[tuple[str, bytes]] = []
            seen = False
            for other_id, event in log.events.items():
                if seen and event.stream_id == stream_id and event.data is not None:
                    later.append((other_id, event.data))
                seen = seen or other_id == event_id
            return stream_id, later


class SessionReplayLog(EventStore):
    """One session's events: the only log its SDK transport can store to or replay from."""

    def __init__(self, logs: ReplayLogs, session_id: str) -> None:
        self.logs, self.session_id = logs, session_id
        self.events: OrderedDict[str, _Event] = OrderedDict()
        self.size = 0

    async def store_event(self, stream_id: StreamId, message: JSONRPCMessage | None) -> EventId:
        event_id = f"{stream_id}:{secrets.token_urlsafe(16)}"
        data = (
            None
            if message is None
            else message.model_dump_json(by_alias=True, exclude_unset=True).encode()
        )
        self.logs._keep(event_id, _Event(self.session_id, stream_id, data))
        return event_id

    def knows(self, event_id: str) -> bool:
        return event_id in self.events

    async def replay_events_after(
        self, last_event_id: EventId, send_callback: EventCallback
    ) -> StreamId | None:
        if last_event_id not in self.events:
            return None
        try:
            stream_id, later = self.logs._after(self.session_id, last_event_id)
        except KeyError:  # dropped (or the session discarded) since the check above
            return None
        for event_id, data in later:
            message = jsonrpc_message_adapter.validate_json(data, by_name=False)
            await send_callback(EventMessage(message, event_id))
        return stream_id
