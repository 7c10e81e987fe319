"""The tools one principal's code can call: the configured sources (the built-ins, installed
plugins, the operator's sources file: every principal's) and the sources stored in the
database (`lockgate sources add`, an approved `tools.lockgate.add_*_source`), global or the
principal's own.

Stored sources are read lazily, the first time a principal's code or listing needs them,
and kept in a cache per principal that is checked against the database (the ids of the rows
that apply, a small read) after `refresh_secs`. A source added or removed on any instance is
therefore seen by every instance within that time, and built on each from the same stored
text (documents are fetched once, when the source is added). The cache holds at most
`CACHED_PRINCIPALS` principals' registries (least recently used leave first); a built source
no cached registry uses any more is closed (an upstream MCP server's connection).

A stored source that cannot be built (an upstream MCP server that does not answer) is left
out of the registries, with a warning, and tried again after `RETRY_SECS`: the principal's
other tools keep working, and a call of one of its tools fails as an unknown tool.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from pydantic import JsonValue

from lockgate.machine.tools.registry import (
    InvalidToolSource,
    Tool,
    ToolContext,
    ToolFailed,
    ToolRegistry,
    ToolSource,
    ToolSpec,
    UnknownTool,
)

if TYPE_CHECKING:
    from lockgate.machine.db.schema import StoredSource

log = logging.getLogger("lockgate.sources")

#: The most principals whose registries are cached at once.
CACHED_PRINCIPALS = 256
#: How long a stored source that could not be built is left out before it is tried again.
RETRY_SECS = 30.0


class StoredRows(Protocol):
    """The store's reads of stored sources that the book needs (`SourceQueries`)."""

    def ids_applying_to(self, principal_id: str | None) -> tuple[str, ...]: ...

    def get(self, source_id: str) -> StoredSource | None: ...


@dataclass
class _Cached:
    checked_until: float
    #: The stored rows it was built from (`SourceQueries.ids_applying_to`).
    ids: tuple[str, ...]
    registry: ToolRegistry


class SourceBook:
    def __init__(
        self,
        configured: Iterable[ToolSource],
        stored: StoredRows | None = None,
        build: Callable[[StoredSource], ToolSource] | None = None,
        refresh_secs: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.configured = list(configured)
        #: Every principal's registry while nothing is stored for it.
        self.base = ToolRegistry()
        for source in self.configured:
            self.base.register(source)
        self._stored, self._build = stored, build
        self._refresh, self._clock = refresh_secs, clock
        self._cache: OrderedDict[str | None, _Cached] = OrderedDict()
        #: Built stored sources, by row id (a global one is shared by every registry).
        self._built: dict[str, ToolSource] = {}
        #: Rows that could not be built, and when to try again.
        self._failed: dict[str, float] = {}
        self._lock = threading.Lock()
        #: One refresh at a time per principal: building a source may take a while (an
        #: upstream to reach, within LOCKGATE_HTTP_TIMEOUT_SECS) and must not happen twice;
        #: one principal's slow upstream never holds another principal's look-up.
        self._building: dict[str | None, threading.Lock] = {}

    def registry_for(self, principal: str | None) -> ToolRegistry:
        """The tools `principal`'s code can call (None: the configured and global ones)."""
        if self._stored is None or self._build is None:
            return self.base
        now = self._clock()
        with self._lock:
            cached = self._cache.get(principal)
            if cached is not None and cached.checked_until > now:
                self._cache.move_to_end(principal)
                return cached.registry
        with self._lock:
            building = self._building.setdefault(principal, threading.Lock())
        with building:
            ids = self._stored.ids_applying_to(principal)
            with self._lock:
                cached = self._cache.get(principal)
            if cached is None or cached.ids != ids or any(row_id in self._failed for row_id in ids):
                registry = self._registry(ids, now) if ids else self.base
            else:
                registry = cached.registry
            with self._lock:
                self._cache[principal] = _Cached(now + self._refresh, ids, registry)
                self._cache.move_to_end(principal)
                while len(self._cache) > CACHED_PRINCIPALS:
                    evicted, _ = self._cache.popitem(last=False)
                    held = self._building.get(evicted)
                    if held is not None and not held.locked():
                        del self._building[evicted]
                unused = self._unused()
            close_sources(unused)
        return registry

    def _registry(self, ids: tuple[str, ...], now: float) -> ToolRegistry:
        assert self._stored is not None and self._build is not None
        registry = ToolRegistry()
        for configured in self.configured:
            registry.register(configured)
        for row_id in ids:
            source: ToolSource | None = self._built.get(row_id)
            if source is None:
                if self._failed.get(row_id, 0.0) > now:
                    continue
                row = self._stored.get(row_id)
                if row is None:  # removed since the ids were read
                    continue
                try:
                    source = self._build(row)
                    if row.principal_id is not None and not row.by_operator:
                        # A source the principal added itself, its tools marked as such.
                        source = OwnedSource(source, row.principal_id)
                except InvalidToolSource as exc:
                    self._failed[row_id] = now + RETRY_SECS
                    log.warning(
                        "stored source %r (%s) cannot be built, its tools are left out for "
                        "%g s: %s",
                        row.name,
                        "global" if row.principal_id is None else "one principal's",
                        RETRY_SECS,
                        exc.message,
                    )
                    continue
                with self._lock:
                    self._failed.pop(row_id, None)
                    # Another principal's look-up built the same global source meanwhile.
                    earlier = self._built.setdefault(row_id, source)
                if earlier is not source:
                    close_sources([source])
                    source = earlier
            try:
                registry.register(source)
            except InvalidToolSource as exc:  # a name clash the catalog could not prevent
                log.warning("stored source %r is left out: %s", source.name, exc.message)
        return registry

    def _unused(self) -> list[ToolSource]:
        """Built sources no cached registry uses any more (the lock held)."""
        used = {row_id for cached in self._cache.values() for row_id in cached.ids}
        gone = [row_id for row_id in self._built if row_id not in used]
        return [self._built.pop(row_id) for row_id in gone]

    def tool_for(self, principal: str | None, name: str) -> Tool:
        """A journaled call's tool; one whose source was removed since (or cannot be built
        now) is a `GoneTool`, whose call fails in words, so the call settles."""
        try:
            return self.registry_for(principal).get(name)
        except UnknownTool:
            return GoneTool(name)

    def forget(self, principal: str | None = None) -> None:
        """Check the database again at the next look-up: `principal`'s (and, for None,
        every principal's, as a global source concerns them all)."""
        with self._lock:
            if principal is None:
                for cached in self._cache.values():
                    cached.checked_until = 0.0
            elif principal in self._cache:
                self._cache[principal].checked_until = 0.0

    def close(self) -> None:
        """Let go of every source (configured and built)."""
        with self._lock:
            built = list(self._built.values())
            self._built.clear()
            self._cache.clear()
        close_sources([*self.configured, *built])


class OwnedTool:
    """A tool of a source a principal added: the same tool, its spec naming its owner (its
    calls then read only that principal's secrets: `Dispatcher`; policy rules name it
    `owner:source.name`: `PolicyRule`)."""

    def __init__(self, tool: Tool, owner: str) -> None:
        self._tool = tool
        self.spec = tool.spec.model_copy(update={"owner": owner})

    def call(self, arguments: dict[str, JsonValue], context: ToolContext) -> JsonValue:
        return self._tool.call(arguments, context)


class OwnedSource:
    """A source a principal added, its tools marked with their owner."""

    def __init__(self, source: ToolSource, owner: str) -> None:
        self.name, self.owner, self._source = source.name, owner, source
        self._tools = [OwnedTool(tool, owner) for tool in source.tools()]

    def tools(self) -> list[OwnedTool]:
        return self._tools

    def close(self) -> None:
        close_sources([self._source])


class GoneTool:
    """A journaled call's tool that is no longer served: its source was removed while the
    call waited (or cannot be reached now). Its call fails in words instead of running."""

    def __init__(self, full_name: str) -> None:
        source, _, name = full_name.partition(".")
        self.spec = ToolSpec(source=source, name=name, description="no longer available")

    def call(self, arguments: dict[str, JsonValue], context: ToolContext) -> JsonValue:
        raise ToolFailed(
            f"{self.spec.call_name} is no longer available (its source was removed, or "
            "cannot be reached now); the call was not made"
        )


def close_sources(sources: Iterable[ToolSource]) -> None:
    """Let go of what sources hold open (an upstream MCP server's process or connection)."""
    for source in sources:
        close = getattr(source, "close", None)
        if callable(close):
            try:
                close()
            except Exception:
                log.exception("closing source %r failed", source.name)


def as_source_book(tools: ToolRegistry | SourceBook) -> SourceBook:
    """A `SourceBook` serving `tools` (a fixed registry: the same for every principal)."""
    if isinstance(tools, SourceBook):
        return tools
    book = SourceBook(())
    book.base = tools
    return book


__all__ = [
    "CACHED_PRINCIPALS",
    "RETRY_SECS",
    "GoneTool",
    "OwnedSource",
    "OwnedTool",
    "SourceBook",
    "as_source_book",
    "close_sources",
]
