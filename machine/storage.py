"""What a principal's executions keep in the database: counted as it is written, bounded per
principal, and purged once finished executions are older than the retention period.

Each execution row carries `stored_bytes`: its code when it is inserted, each journaled
call's arguments (and their preview), decision and result as they are written, and, when it
finishes, what it keeps from then on (its result, logs, what it ran, its snapshot). The
counting happens in the write path's own transaction (`grown`), so no write escapes it and
nothing reads a blob back to measure it. What an unfinished execution holds besides (its
snapshot and logs so far, replaced at each checkpoint) is bounded by its own limits
(`LOCKGATE_MAX_MEMORY_BYTES`, `LOCKGATE_MAX_LOG_CHARS`) times the unfinished executions a
principal may have (`LOCKGATE_MAX_PAUSED_PER_PRINCIPAL`).

The budget (`LOCKGATE_MAX_STORED_BYTES_PER_PRINCIPAL`) is the sum over the principal's rows,
read from an index: checked in the transaction that inserts an execution (`StoredUnder`),
and before a running execution journals a call (its arguments would be kept).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from pydantic import JsonValue

from lockgate.machine.db.schema import Execution, ToolCall
from lockgate.machine.db.storage_queries import Grow, StoredUnder
from lockgate.machine.execution_errors import LimitReached
from lockgate.machine.sandbox_results import Raised
from lockgate.machine.values import json_size
from lockgate.spec import EXECUTION

if TYPE_CHECKING:  # both import this module's callers' modules
    from lockgate.machine.db.store import SqlStore
    from lockgate.machine.journal_records import ExecutionRecord
    from lockgate.machine.write_path import Decided

log = logging.getLogger("lockgate.storage")

SETTING = "LOCKGATE_MAX_STORED_BYTES_PER_PRINCIPAL"
_FINISHED = frozenset(s.name for s in EXECUTION.states if s.terminal)
#: A call's columns that are kept: its arguments (and their preview) from its insert, its
#: decision and result written once, when they are made.
_CALL_KEPT = ("arguments", "arguments_preview", "decision", "result")
_CALL_SETTLED = ("decision", "result")
#: What a finished execution keeps besides its code.
_FINISHED_KEPT = ("outcome", "logs", "what_ran", "snapshot")
#: Journal rows (a finished execution's calls) one purge round deletes at most, beyond the
#: first execution's; whole executions only.
PURGE_ROWS = 2000
#: Principals whose last sum a `StorageBudget` remembers at most.
MAX_REMEMBERED = 10_000


def size_of(value: object) -> int:
    """Bytes a column's value takes: raw bytes, UTF-8 text, or compact JSON."""
    if value is None:
        return 0
    if isinstance(value, bytes):
        return len(value)
    if isinstance(value, str):
        return len(value.encode("utf-8", "surrogatepass"))
    return json_size(value)  # type: ignore[arg-type]


def grown(inserts: Iterable[object], decided: Iterable[Decided]) -> list[Grow]:
    """What a transaction adds to the bytes its executions keep. A new execution's row gets
    its code's size before it is inserted; the rest is one `Grow` for the transaction."""
    more: defaultdict[str, int] = defaultdict(int)
    for row in inserts:
        if isinstance(row, Execution):
            row.stored_bytes = size_of(row.code)
        elif isinstance(row, ToolCall):
            more[row.execution_id] += sum(size_of(getattr(row, c)) for c in _CALL_KEPT)
    for step, _, change in decided:
        if change.machine == "tool_call":
            kept = sum(size_of(change.updates[c]) for c in _CALL_SETTLED if c in change.updates)
            if kept:
                # A call's id is "<execution id>:<sequence>".
                more[change.record_id.rsplit(":", 1)[0]] += kept
        elif change.machine == "execution" and change.dest in _FINISHED:
            held = step.record.fields
            more[change.record_id] += sum(
                size_of(change.updates.get(c, held.get(c))) for c in _FINISHED_KEPT
            )
    return [Grow(tuple(more.items()))] if more else []


def refused_at_budget(stored: int, limit: int) -> LimitReached:
    return LimitReached(
        f"Your executions keep {stored} bytes in the database, at the limit of {limit} "
        f"bytes ({SETTING}). The code was not started.",
        hint="Finished executions are purged after the retention period "
        "(LOCKGATE_FINISHED_RETENTION); until then, send smaller arguments and results, "
        "or ask the operator for a larger budget.",
        setting=SETTING,
        limit=limit,
    )


def call_over_budget(call_name: str, stored: int, adding: int, limit: int) -> Raised | None:
    """The error a call's code sees when journaling its `adding` bytes of arguments would
    take the principal past its budget (None when within)."""
    if stored + adding <= limit:
        return None
    return Raised(
        "RuntimeError",
        f"{call_name} was not called: its arguments ({adding} bytes) would take your "
        f"executions past the {limit} bytes they may keep in the database ({SETTING}; they "
        f"keep {stored} now). Finished executions are purged after the retention period "
        "(LOCKGATE_FINISHED_RETENTION).",
    )


class StorageBudget:
    """The budget as a running execution meets it: before a new call is journaled.

    Reads are the hot path (a call that rides with the next commit costs no round trip of
    its own), so the principal's sum is read at most every `FRESH_SECS` per principal, and
    afresh for arguments of `FRESH_BYTES` or more: between two reads a principal's calls can
    add at most what small calls add in that time; a new execution's admission counts
    exactly, in its own transaction."""

    FRESH_SECS = 1.0
    FRESH_BYTES = 4096

    def __init__(
        self, store: SqlStore, limit: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.store, self.limit, self.clock = store, limit, clock
        self._read: dict[str, tuple[float, int]] = {}
        self._lock = threading.Lock()

    def refuses(self, ex: ExecutionRecord, call_name: str, sent: JsonValue) -> Raised | None:
        """The error for a call whose arguments the principal's budget cannot keep."""
        principal, adding, now = ex.typed.principal_id, json_size(sent), self.clock()
        with self._lock:
            at, stored = self._read.get(principal, (-self.FRESH_SECS, 0))
        if adding >= self.FRESH_BYTES or now - at >= self.FRESH_SECS:
            stored = self.store.storage.stored_bytes(principal)
            with self._lock:
                if len(self._read) >= MAX_REMEMBERED:
                    self._read.clear()  # principals seen lately are read again, that is all
                self._read[principal] = (now, stored)
        return call_over_budget(call_name, stored, adding, self.limit)


def within_budget(principal_id: str, limit: int) -> StoredUnder:
    """The check a new execution's insert makes in its own transaction."""
    return StoredUnder(principal_id, limit, lambda stored: refused_at_budget(stored, limit))


@dataclass(frozen=True)
class Purged:
    executions: int
    calls: int


def purge_finished(store: SqlStore, retention: timedelta, clock: Callable[[], datetime]) -> Purged:
    """One maintenance round's purge: the oldest executions finished before the retention
    period, whole (with their calls, their transitions and their delivered or abandoned
    webhook events), up to about `PURGE_ROWS` journal rows."""
    purged = store.storage.purge_finished(clock() - retention, PURGE_ROWS)
    if purged[0]:
        log.info(
            "purged %d finished executions (%d calls) older than the retention period",
            *purged,
        )
    return Purged(*purged)
