"""The shape every lifecycle record has on the write path."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar


@dataclass
class Record:
    """A lifecycle row as the write path sees it: identity, status, version, columns (what
    the spec's guards and effects read by name)."""

    machine: str
    id: str
    status: str
    version: int = 0
    fields: dict[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # A status enum member and its plain string must be the same thing here: the
        # machines and the database both speak plain strings.
        self.status = str(self.status)

    def absorb(self, change: Change) -> None:
        """Become what the committed `change` left in the database."""
        self.status = change.dest
        self.version += 1
        self.fields.update(change.updates)


class LifecycleRow(Protocol):
    """A stored row of a lifecycle (an execution, a call, a session...)."""

    id: str
    status: str
    version: int

    def model_dump(self) -> dict[str, object]: ...


RowT = TypeVar("RowT", bound=LifecycleRow)


@dataclass
class RowRecord(Record, Generic[RowT]):
    """A record together with the typed row it was read from, kept in step with it: code
    that drives a record reads its columns with their types (`call.row.tool`, a `str`)
    rather than out of `fields` with casts, and sees every committed change in both."""

    row: RowT | None = None

    @classmethod
    def of(cls, machine: str, row: RowT) -> RowRecord[RowT]:
        return cls(machine, row.id, row.status, row.version, row.model_dump(), row)

    @property
    def typed(self) -> RowT:
        assert self.row is not None, "a RowRecord is built from its row (RowRecord.of)"
        return self.row

    def absorb(self, change: Change) -> None:
        super().absorb(change)
        row = self.typed
        for name, value in change.updates.items():
            setattr(row, name, value)
        row.status, row.version = self.status, self.version


@dataclass(frozen=True)
class Change:
    """One record's transition inside a transaction; the store applies it only when the
    stored row still has `expected_version` and `source` (optimistic concurrency)."""

    machine: str
    record_id: str
    event: str
    source: str
    dest: str
    expected_version: int
    updates: Mapping[str, object]


@dataclass(frozen=True)
class Fence:
    """A record that must still be at `version` for a transaction to commit, though it does
    not change: a call's transition is fenced by its execution, so an instance that lost the
    execution (declared dead, then woken) cannot move its calls any more."""

    machine: str
    record_id: str
    version: int
