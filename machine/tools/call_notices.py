"""What a tool says while its call runs (log messages, progress), passed on to whoever waits
for the execution in this process: the MCP request that started it, which relays them to
its client as `notifications/message` and `notifications/progress`.

Best effort and never stored, as MCP's notifications are: a notice said while nobody waits
(the request answered already, the call resumed on another instance, after a restart) is
dropped. A tool says them through its `ToolContext` (`context.log(...)`,
`context.progress(...)`); what it says is scrubbed of its secrets like its answer.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from pydantic import JsonValue

log = logging.getLogger("lockgate.tools")

#: MCP's log levels, least severe first (RFC 5424's).
LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")


@dataclass(frozen=True)
class LogNotice:
    level: str
    data: JsonValue


@dataclass(frozen=True)
class ProgressNotice:
    progress: float
    total: float | None = None
    message: str | None = None


@dataclass(frozen=True)
class StreamRelease:
    """The tool will run long: the request's stream may be let go now (SEP-1699), and the
    client polls for the answer (it reconnects with Last-Event-ID)."""


CallNotice = LogNotice | ProgressNotice | StreamRelease
Listener = Callable[[CallNotice], None]


class CallNotices:
    """Listeners by execution id. A listener runs on the thread that made the call: it must
    hand the notice on, not do the sending itself."""

    def __init__(self) -> None:
        self._listeners: dict[str, list[Listener]] = {}
        self._lock = threading.Lock()

    @contextmanager
    def listening(self, execution_id: str, listener: Listener) -> Iterator[None]:
        """`listener` hears the execution's notices while the block runs."""
        with self._lock:
            self._listeners.setdefault(execution_id, []).append(listener)
        try:
            yield
        finally:
            with self._lock:
                listeners = self._listeners.get(execution_id, [])
                listeners.remove(listener)
                if not listeners:
                    self._listeners.pop(execution_id, None)

    def publish(self, execution_id: str, notice: CallNotice) -> None:
        with self._lock:
            listeners = list(self._listeners.get(execution_id, ()))
        for listener in listeners:
            try:
                listener(notice)
            except Exception:  # a listener's failure is never the tool's
                log.exception("a listener of execution %s failed", execution_id)


def nobody(notice: CallNotice) -> None:
    """Where a call's notices go when nothing relays them (in-process calls, tests)."""
