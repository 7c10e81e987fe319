"""An in-memory store for the model-level tests (tests/unit/test_machine.py, test_write_path.py):
the write path over it without a database. Like every store it refuses, on its own, a
(from, to) pair the spec does not declare (`refuse_undeclared`, shared with the SQL store)."""

from __future__ import annotations

import copy
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lockgate.machine.db.storage_queries import Grow
from lockgate.machine.errors import Conflict
from lockgate.machine.records import Change, Fence, Record
from lockgate.machine.store import declared_edges, refuse_undeclared
from lockgate.spec import MACHINES, MachineSpec


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
        #: Whether each commit, in order, was to wait for the disk.
        self.waited: list[bool] = []

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
        *,
        wait_for_disk: bool = True,  # recorded in `waited`: memory has no disk to wait for
    ) -> None:
        grows = [w for w in writes if isinstance(w, Grow)]
        if len(grows) != len(writes):
            # Other store-level writes are SQL statements (a cap counted in the insert's
            # transaction); the model-level tests that use this store never make one.
            raise TypeError("the memory store carries no store-level writes but Grow")
        with self._lock:
            # Worked out on a copy and swapped in at the end: all or nothing. Changes apply
            # in order, so a row inserted here may move, and a row may move twice.
            rows = dict(self._rows)
            copied: set[tuple[str, str]] = set()
            done: list[Persisted] = []
            for fence in fences:
                held = rows.get((fence.machine, fence.record_id))
                if held is None or held.version != fence.version:
                    raise Conflict(
                        machine=fence.machine,
                        record_id=fence.record_id,
                        expected_version=fence.version,
                    )
            for grow in grows:  # the bytes an execution keeps, as the SQL store adds them
                for execution_id, more in grow.by_execution:
                    key = ("execution", execution_id)
                    if key in rows:
                        rows[key] = held = copy.deepcopy(rows[key])
                        copied.add(key)
                        kept = int(str(held.fields.get("stored_bytes", 0)))
                        held.fields["stored_bytes"] = kept + more
            for new in inserts:
                if not isinstance(new, Record):
                    raise TypeError("the memory store inserts Records")
                key = (new.machine, new.id)
                if key in rows:
                    raise Conflict(machine=new.machine, record_id=new.id, expected_version=0)
                rows[key] = copy.deepcopy(new)
                copied.add(key)
            for change in changes:
                refuse_undeclared(change, self._edges)
                key = (change.machine, change.record_id)
                row = rows.get(key)
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
                if key not in copied:
                    row = rows[key] = copy.deepcopy(row)
                    copied.add(key)
                row.status = change.dest
                row.version += 1
                row.fields.update(copy.deepcopy(dict(change.updates)))
                done.append(
                    Persisted(
                        change.machine,
                        change.record_id,
                        change.event,
                        change.source,
                        change.dest,
                        row.version,
                    )
                )
            self._rows = rows
            self.history.extend(done)
            self.waited.append(wait_for_disk)
