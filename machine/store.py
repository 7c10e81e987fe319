"""The store interface the write path commits through, and its in-memory implementation.

Every store refuses, on its own, a (from, to) pair the spec does not declare for the event:
the spec decides what is legal even if a caller bypassed the machines.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from lockgate.machine.errors import Conflict, IllegalTransition
from lockgate.machine.records import Change, Fence, Record
from lockgate.spec import MACHINES, MachineSpec


def declared_edges(specs: Mapping[str, MachineSpec]) -> frozenset[tuple[str, str, str, str]]:
    """(machine, event, source, dest) for every edge of every lifecycle."""
    return frozenset(
        (name, t.event, source, dest)
        for name, spec in specs.items()
        for t in spec.transitions
        for source, dest in t.edges()
    )


def refuse_undeclared(change: Change, edges: frozenset[tuple[str, str, str, str]]) -> None:
    if (change.machine, change.event, change.source, change.dest) not in edges:
        raise IllegalTransition(
            machine=change.machine,
            record_id=change.record_id,
            event=change.event,
            source=change.source,
            dest=change.dest,
        )


class TransitionStore(Protocol):
    def commit(
        self,
        changes: Sequence[Change],
        inserts: Sequence[Any] = (),
        fences: Sequence[Fence] = (),
        writes: Sequence[Any] = (),
    ) -> None:
        """Insert the new rows, apply every change and make every store-level write (the SQL
        store's `StoreWrite`s) in one transaction, if every fence still holds; or do nothing
        (raising `Conflict`, `IllegalTransition` or the write's own refusal)."""


@dataclass(frozen=True)
class Persisted:
    """One committed transition, as the store's history keeps it."""

    machine: str
    record_id: str
    event: str
    source: str
    dest: str
    version: int


class MemoryStore:
    """A complete in-process store: used by the model-level tests and as a reference."""

    def __init__(self, specs: Mapping[str, MachineSpec] | None = None) -> None:
        self._edges = declared_edges(MACHINES if specs is None else specs)
        self._rows: dict[tuple[str, str], Record] = {}
        self._lock = threading.Lock()
        self.history: list[Persisted] = []

    def insert(self, record: Record) -> None:
        with self._lock:
            key = (record.machine, record.id)
            if key in self._rows:
                raise ValueError(f"{record.machine} {record.id} already exists")
            self._rows[key] = copy.deepcopy(record)

    def get(self, machine: str, record_id: str) -> Record:
        with self._lock:
            return copy.deepcopy(self._rows[(machine, record_id)])

    def all(self, machine: str) -> list[Record]:
        with self._lock:
            return [copy.deepcopy(r) for (m, _), r in self._rows.items() if m == machine]

    def commit(
        self,
        changes: Sequence[Change],
        inserts: Sequence[Any] = (),
        fences: Sequence[Fence] = (),
        writes: Sequence[Any] = (),
    ) -> None:
        if writes:
            # Store-level writes are SQL statements (an approval link used up with its
            # decision); the model-level tests that use this store never make one.
            raise TypeError("the memory store carries no store-level writes")
        with self._lock:
            for fence in fences:
                held = self._rows.get((fence.machine, fence.record_id))
                if held is None or held.version != fence.version:
                    raise Conflict(
                        machine=fence.machine,
                        record_id=fence.record_id,
                        expected_version=fence.version,
                    )
            for row in inserts:
                if not isinstance(row, Record):
                    raise TypeError("the memory store inserts Records")
                if (row.machine, row.id) in self._rows:
                    raise Conflict(machine=row.machine, record_id=row.id, expected_version=0)
            for change in changes:
                refuse_undeclared(change, self._edges)
                row = self._rows.get((change.machine, change.record_id))
                if (
                    row is None
                    or row.version != change.expected_version
                    or row.status != change.source
                ):
                    raise Conflict(
                        machine=change.machine,
                        record_id=change.record_id,
                        expected_version=change.expected_version,
                    )
            for new in inserts:
                self._rows[(new.machine, new.id)] = copy.deepcopy(new)
            for change in changes:
                row = self._rows[(change.machine, change.record_id)]
                row.status = change.dest
                row.version += 1
                row.fields.update(copy.deepcopy(dict(change.updates)))
                self.history.append(
                    Persisted(
                        change.machine,
                        change.record_id,
                        change.event,
                        change.source,
                        change.dest,
                        row.version,
                    )
                )
