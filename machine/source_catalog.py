"""Adding, listing and removing the tool sources stored in the database: one set of rules
for `lockgate sources` (the operator) and agent code's `tools.lockgate.*` (a principal, once
a person approved the call).

A source is checked by building it before anything is stored: its document fetched and
parsed, its upstream reached, its auth table read. What is stored is the settled table
(`settled_source`): documents as text, so every instance builds the same tools from it. A
principal's source is that principal's alone; a global one (operator only) is everyone's.
Names are unique among what one principal sees: the configured sources, the global ones,
and its own.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from pydantic import JsonValue

from lockgate.machine.db.schema import StoredSource
from lockgate.machine.db.source_queries import SourceQueries
from lockgate.machine.secrets import SecretStore
from lockgate.machine.source_book import SourceBook, close_sources
from lockgate.machine.tools.errors import InvalidToolSource
from lockgate.machine.tools.kinds import kind_named
from lockgate.machine.tools.source_entries import is_url
from lockgate.machine.tools.source_tables import REQUEST, Origin
from lockgate.machine.tools.spec import ToolSource, left_out_of

if TYPE_CHECKING:
    from lockgate.machine.tools.http_calls import HttpLimits
    from lockgate.machine.tools.outbound import IPNetwork

#: Where a stored source's table is built from: its documents are text, no file is named;
#: a principal's own is held to what a principal may send (no command, no YAML alias).
STORED = Origin("the database", None)
STORED_OWNED = Origin("the database", None, commands=False)


@dataclass(frozen=True)
class SourceSummary:
    name: str
    kind: str
    #: "configured" (the server's own), "global" (stored for everyone) or "own".
    scope: str
    #: How many tools it gives (0: it cannot be built now).
    tools: int
    principal_id: str | None = None
    #: What its document has that it cannot serve, each named with why.
    left_out: tuple[str, ...] = ()

    def as_json(self) -> dict[str, JsonValue]:
        found: dict[str, JsonValue] = {
            "name": self.name,
            "kind": self.kind,
            "scope": self.scope,
            "tools": self.tools,
        }
        if self.left_out:
            found["left_out"] = list(self.left_out)
        return found


class _PrincipalSecrets:
    """`secrets` as a source reads them while it is added or built (a GraphQL endpoint's
    introspection): a principal's source its principal's own only; a global one the
    operator's."""

    def __init__(self, secrets: SecretStore, principal: str | None) -> None:
        self._secrets, self._principal = secrets, principal

    def resolve(
        self,
        names: Any,
        *,
        principal: str | None = None,
        source: str | None = None,
        own_only: bool = False,
    ) -> dict[str, str]:
        return self._secrets.resolve(
            names,
            principal=self._principal,
            source=source,
            own_only=own_only or self._principal is not None,
        )


class SourceCatalog:
    def __init__(
        self,
        stored: SourceQueries,
        book: SourceBook,
        limits: HttpLimits,
        secrets: SecretStore,
        max_per_principal: int,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        *,
        allowed_networks: tuple[IPNetwork, ...] = (),
    ) -> None:
        self.stored, self.book, self.limits, self.secrets = stored, book, limits, secrets
        self.max_per_principal, self.clock = max_per_principal, clock
        #: A principal's sources reach public addresses only (and the allowed networks).
        self.principal_limits = limits.for_principal(allowed_networks)

    def limits_for(self, principal: str | None) -> HttpLimits:
        """The operator's sources reach what they name; a principal's, public addresses."""
        return self.limits if principal is None else self.principal_limits

    def build(self, row: StoredSource) -> ToolSource:
        """The source a stored row describes (for `SourceBook`)."""
        config = row.config if isinstance(row.config, dict) else {}
        owner = owner_of(row)
        return kind_named(row.kind, stored=True).build(
            config,
            STORED if owner is None else STORED_OWNED,
            self.limits_for(owner),
            _PrincipalSecrets(self.secrets, owner),
        )

    def add(
        self,
        kind: str,
        entry: Mapping[str, Any],
        *,
        principal: str | None,
        origin: Origin,
        by_operator: bool = False,
    ) -> SourceSummary:
        """Check and store a source for `principal` (None: everyone). Adding the same
        source again is no change (a retried call); another under a taken name is refused.
        `by_operator`: the operator added it (`lockgate sources add`); otherwise it is the
        principal's own, held to what a principal may reach."""
        owner = None if by_operator else principal
        settled = kind_named(kind, stored=True)
        name = entry.get("name")
        if isinstance(name, str):
            self._check_free(name, principal)
        config, source = settled.settled(
            entry,
            origin,
            self.limits_for(owner),
            _PrincipalSecrets(self.secrets, owner),
        )
        tools, left_out = len(source.tools()), left_out_of(source)
        close_sources([source])  # each instance builds its own from the stored table
        size, bound = len(json.dumps(config).encode()), self.limits.document_bytes
        if size > bound:
            raise InvalidToolSource(
                f"source {config['name']!r} is {size} bytes once settled; a stored source may "
                f"be at most {bound} bytes (LOCKGATE_MAX_SOURCE_DOCUMENT_BYTES)",
                hint="Keep a smaller document (only the operations agents need).",
            )
        row = StoredSource(
            id=uuid.uuid4().hex,
            principal_id=principal,
            name=config["name"],
            kind=kind,
            config=config,
            created_at=self.clock(),
            by_operator=principal is None or by_operator,
        )
        most = self.max_per_principal if principal is not None else None
        stored = self.stored.add(row, most=most)
        if stored == "full":
            raise InvalidToolSource(
                f"you already have {self.max_per_principal} sources, the most one principal "
                "may add",
                hint="Remove one you no longer need with remove_source first.",
            )
        assert isinstance(stored, StoredSource)
        if stored.id != row.id and (stored.kind, stored.config) != (kind, config):
            raise InvalidToolSource(
                f"a source named {row.name!r} is already stored",
                hint="Remove it first, or give the new one another name.",
            )
        self.book.forget(principal)
        scope = "global" if principal is None else "own"
        return SourceSummary(row.name, kind, scope, tools, principal, left_out)

    def precheck(self, kind: str, entry: Mapping[str, Any]) -> list[str]:
        """What is wrong with a principal's source that can be told before anyone is asked
        to approve adding it: a name of the server's own sources, an inline document or
        schema that cannot be read, a destination it may not reach (each URL it names, and
        an inline document's server, resolved now: checked again at every connection)."""
        from lockgate.machine.tools.outbound import refusals

        name = entry.get("name")
        if name == "lockgate" or any(s.name == name for s in self.book.configured):
            return [f"{name!r} is the name of one of the server's configured sources"]
        urls = _urls_named(entry)
        checked = kind_named(kind, stored=True)
        if checked.offline(entry):
            try:
                built = checked.build(entry, REQUEST, self.principal_limits, None)
            except InvalidToolSource as exc:
                return [f"{exc.message}. {exc.hint}" if exc.hint else exc.message]
            served = getattr(built, "base_url", None)
            if isinstance(served, str):
                urls.append(served)
            close_sources([built])
        return refusals(self.principal_limits.reach, urls)

    def _check_free(self, name: str, principal: str | None) -> None:
        """Refuse a name one who would see the new source already sees another under."""
        if name == "lockgate" or any(s.name == name for s in self.book.configured):
            raise InvalidToolSource(
                f"{name!r} is the name of one of the server's configured sources",
                hint="Give the new source another name.",
            )
        if principal is not None:
            if any(
                row.name == name and row.principal_id is None
                for row in self.stored.applying_to(principal)
            ):
                raise InvalidToolSource(
                    f"{name!r} is the name of a global source", hint="Give it another name."
                )
            return
        taken = [row for row in self.stored.all() if row.name == name and row.principal_id]
        if taken:
            raise InvalidToolSource(
                f"{len(taken)} principals have a source named {name!r} of their own",
                hint="Give the global source another name (they would lose theirs).",
            )

    def listed(self, principal: str | None) -> list[SourceSummary]:
        """The sources `principal` sees: configured, global, its own (None: configured and
        global), each with how many tools it gives now."""
        registry = self.book.registry_for(principal)
        namespace, left_out = registry.namespace(), registry.left_out()
        found = [
            SourceSummary(
                s.name,
                _kind(s),
                "configured",
                len(namespace.get(s.name, ())),
                left_out=left_out.get(s.name, ()),
            )
            for s in self.book.configured
        ]
        for row in self.stored.applying_to(principal):
            scope = "global" if row.principal_id is None else "own"
            count, warnings = len(namespace.get(row.name, ())), left_out.get(row.name, ())
            found.append(
                SourceSummary(row.name, row.kind, scope, count, row.principal_id, warnings)
            )
        return found

    def every(self) -> list[StoredSource]:
        """Every stored source, every principal's (for the operator)."""
        return self.stored.all()

    def remove(self, name: str, *, principal: str | None) -> SourceSummary:
        """Remove `principal`'s source `name` (None: the global one)."""
        row = self.stored.remove(principal, name)
        if row is None:
            if any(s.name == name for s in self.book.configured):
                raise InvalidToolSource(
                    f"{name!r} is one of the server's configured sources",
                    hint="Only the operator can remove it, from the server's configuration.",
                )
            whose = "global source" if principal is None else "source of yours"
            raise InvalidToolSource(
                f"there is no {whose} named {name!r}",
                hint="list_sources shows the sources you can remove.",
            )
        self.book.forget(principal)
        scope = "global" if principal is None else "own"
        return SourceSummary(row.name, row.kind, scope, 0, principal)


def owner_of(row: StoredSource) -> str | None:
    """The principal a stored source is held to (it added the source itself), or None for
    the operator's (global, or added by the operator for a principal)."""
    return None if row.by_operator or row.principal_id is None else row.principal_id


def _urls_named(entry: Mapping[str, Any]) -> list[str]:
    """Every destination a source's table names: its document's URL, base URL, endpoint,
    upstream URL and OAuth token URL."""
    auth = entry.get("auth")
    named = [entry.get(k) for k in ("document", "base_url", "endpoint", "url")]
    named.append(auth.get("oauth_token_url") if isinstance(auth, dict) else None)
    return [url for url in named if isinstance(url, str) and is_url(url)]


def _kind(source: ToolSource) -> str:
    """A configured source's kind, in the words of the sources file (each built-in source
    class says its own; any other is a `[[python]]` or plugin source)."""
    kind = getattr(source, "kind", None)
    return kind if isinstance(kind, str) else "python"
