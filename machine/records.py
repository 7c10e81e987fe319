"""The shape every lifecycle record has on the write path."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass
class Record:
    """A lifecycle row as the write path sees it: identity, status, version, columns."""

    machine: str
    id: str
    status: str
    version: int = 0
    fields: dict[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # A status enum member and its plain string must be the same thing here: the
        # machines and the database both speak plain strings.
        self.status = str(self.status)


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
