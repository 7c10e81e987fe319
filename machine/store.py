"""The store interface the write path commits through (the SQL store in `machine/db/` is the
product's; an in-memory one for the model-level tests is in `tests/support/memory_store.py`).

Every store refuses, on its own, a (from, to) pair the spec does not declare for the event:
the spec decides what is legal even if a caller bypassed the machines.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from lockgate.machine.errors import IllegalTransition
from lockgate.machine.records import Change, Fence
from lockgate.spec import MachineSpec


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
        *,
        wait_for_disk: bool = True,
    ) -> None:
        """Insert the new rows, apply every change and make every store-level write (the SQL
        store's `StoreWrite`s) in one transaction, if every fence still holds; or do nothing
        (raising `Conflict`, `IllegalTransition` or the write's own refusal). With
        `wait_for_disk` False the commit returns before the disk has it
        (`TransitionSpec.waits_for_disk`)."""
