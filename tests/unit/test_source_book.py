"""Each principal's tools, built lazily from the stored sources and kept in a bounded cache
that is checked against the database only after its refresh time (`SourceBook`)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

import pytest
from pydantic import JsonValue

import lockgate.machine.source_book as source_book
from lockgate.machine.db.schema import StoredSource
from lockgate.machine.source_book import RETRY_SECS, SourceBook
from lockgate.machine.tools.errors import InvalidToolSource
from lockgate.machine.tools.spec import Tool, ToolContext, ToolSpec


class FakeTool:
    def __init__(self, source: str) -> None:
        self.spec = ToolSpec(source=source, name="ping", description="d")

    def call(self, arguments: dict[str, JsonValue], context: ToolContext) -> JsonValue:
        return "pong"


class FakeSource:
    def __init__(self, name: str) -> None:
        self.name = name
        self.closed = False

    def tools(self) -> Sequence[Tool]:
        return [FakeTool(self.name)]

    def close(self) -> None:
        self.closed = True


class FakeRows:
    """The store's reads, counting them."""

    def __init__(self) -> None:
        self.rows: dict[str, StoredSource] = {}
        self.reads = 0

    def add(self, name: str, principal: str | None) -> None:
        self.rows[name] = StoredSource(
            id=name, principal_id=principal, name=name, kind="openapi", config={},
            created_at=datetime.now(UTC),
        )  # fmt: skip

    def ids_applying_to(self, principal_id: str | None) -> tuple[str, ...]:
        self.reads += 1
        return tuple(
            row.id for row in self.rows.values() if row.principal_id in (None, principal_id)
        )

    def get(self, source_id: str) -> StoredSource | None:
        return self.rows.get(source_id)


class Builder:
    def __init__(self) -> None:
        self.built: list[FakeSource] = []
        self.failing: set[str] = set()

    def __call__(self, row: StoredSource) -> FakeSource:
        if row.name in self.failing:
            raise InvalidToolSource(f"source {row.name!r}: unreachable")
        made = FakeSource(row.name)
        self.built.append(made)
        return made


def sources_of(book: SourceBook, principal: str) -> list[str]:
    return sorted(book.registry_for(principal).namespace())


def test_stored_sources_are_built_once_and_checked_again_only_after_the_refresh() -> None:
    now = [0.0]
    rows, build = FakeRows(), Builder()
    book = SourceBook([FakeSource("notes")], rows, build, refresh_secs=2.0, clock=lambda: now[0])
    assert book.registry_for("alice") is book.base  # nothing stored: the shared registry
    rows.add("shop", "alice")
    rows.add("everyone", None)
    assert sources_of(book, "alice") == ["notes"]  # within the refresh: what was read
    assert rows.reads == 1
    now[0] = 2.5
    assert sources_of(book, "alice") == ["everyone", "notes", "shop"]
    assert sources_of(book, "bob") == ["everyone", "notes"]
    # The global source is built once for both; nothing is rebuilt while the ids hold.
    assert [s.name for s in build.built] == ["shop", "everyone"]
    now[0] = 5.0
    assert sources_of(book, "alice") == ["everyone", "notes", "shop"]
    assert len(build.built) == 2

    # Removed: gone from the registry at the next check, and its source closed.
    shop = build.built[0]
    del rows.rows["shop"]
    book.forget("alice")
    assert sources_of(book, "alice") == ["everyone", "notes"]
    assert shop.closed


def test_the_cache_is_bounded_and_a_source_that_cannot_be_built_is_left_out_for_a_while(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [0.0]
    rows, build = FakeRows(), Builder()
    book = SourceBook([], rows, build, refresh_secs=0.0, clock=lambda: now[0])
    monkeypatch.setattr(source_book, "CACHED_PRINCIPALS", 3)
    for n in range(6):
        rows.add(f"own{n}", f"p{n}")
        assert sources_of(book, f"p{n}") == [f"own{n}"]
    assert len(book._cache) == 3  # the least recently used left ...
    assert [s.closed for s in build.built] == [True, True, True, False, False, False]  # ... closed

    build.failing.add("down")
    rows.add("down", "alice")
    rows.add("up", "alice")
    assert sources_of(book, "alice") == ["up"]  # the other sources keep working
    build.failing.clear()
    now[0] = RETRY_SECS / 2
    assert sources_of(book, "alice") == ["up"]  # not tried again at once
    now[0] = RETRY_SECS + 1
    assert sources_of(book, "alice") == ["down", "up"]
