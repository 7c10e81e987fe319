"""Reading a source's table, the parts every kind of source shares: its name and keys, its
`auth` table, the text of a document it names (a file, a URL or the text itself), and a
document nobody here wrote refused in words rather than as an internal error."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from lockgate.machine.tools.errors import InvalidToolSource, ToolFailed
from lockgate.machine.tools.http_calls import Auth, HttpLimits, fetch
from lockgate.machine.tools.source_tables import AUTH_FORMS, Origin
from lockgate.machine.tools.spec import is_identifier

#: The largest document (OpenAPI, SDL) an operator's source may be fetched from a URL (a
#: principal's: `LOCKGATE_MAX_SOURCE_DOCUMENT_BYTES`, `HttpLimits.document_bytes`).
MAX_DOCUMENT_BYTES = 64 * 1024 * 1024


@contextmanager
def in_words(entry: Mapping[str, Any]) -> Iterator[None]:
    """A document nobody here wrote can break a parser or a builder in ways no check
    foresaw: that is the source refused in words, never an internal error."""
    try:
        yield
    except InvalidToolSource:
        raise
    except RecursionError:
        raise InvalidToolSource(
            f"source {entry.get('name')!r}: its document is nested too deep to read"
        ) from None
    except (ValueError, TypeError, KeyError, AttributeError, IndexError) as exc:
        raise InvalidToolSource(
            f"source {entry.get('name')!r}: its document cannot be served "
            f"({type(exc).__name__}: {str(exc)[:200]})",
            hint="Check that it is an OpenAPI 3.0/3.1 document (or a GraphQL schema).",
        ) from None


def named(entry: Mapping[str, Any], path: Origin, kind: str, keys: tuple[str, ...]) -> str:
    """The source's name, once its table holds only `keys` (and a name)."""
    name = entry.get("name")
    if not isinstance(name, str) or not is_identifier(name):
        raise InvalidToolSource(
            f"{path}: a [[{kind}]] source needs a name that is a Python identifier (got {name!r})",
            hint="Agent code calls tools.<name>.<tool>(...).",
        )
    extra = sorted(set(entry) - set(keys) - {"name"})
    if extra:
        raise InvalidToolSource(
            f"source {name!r} in {path}: unknown keys {', '.join(extra)}",
            hint=f"A [[{kind}]] source has name, {', '.join(sorted(keys))}.",
        )
    return name


def auth_table(name: str, table: object, path: Origin) -> Auth | None:
    """A source's `auth` table: which secret, carried how."""
    if table is None:
        return None
    problem = f"source {name!r} in {path}: auth must be one of {AUTH_FORMS}"
    if not isinstance(table, Mapping):
        raise InvalidToolSource(problem)
    keys = set(table)
    values = {key: value for key, value in table.items() if isinstance(value, str) and value}
    if len(values) != len(keys):
        raise InvalidToolSource(problem)
    if keys == {"bearer"} or keys == {"basic"}:
        (kind,) = keys
        return Auth(secret=values[kind], kind=kind)
    for kind in ("header", "query"):
        if keys == {kind, "secret"}:
            return Auth(secret=values["secret"], kind=kind, field=values[kind])
    if keys in ({"oauth_token_url", "secret"}, {"oauth_token_url", "secret", "scope"}):
        url = values["oauth_token_url"]
        if not url.startswith(("http://", "https://")):
            raise InvalidToolSource(f"source {name!r} in {path}: oauth_token_url must be http(s)")
        return Auth(secret=values["secret"], kind="oauth", field=url, scope=values.get("scope", ""))
    raise InvalidToolSource(problem)


def is_url(value: object) -> bool:
    return isinstance(value, str) and value.startswith(("http://", "https://"))


def _looks_like_a_file(where: str) -> bool:
    return not any(c.isspace() for c in where) and (
        "/" in where or where.endswith((".json", ".yaml", ".yml", ".graphql", ".gql"))
    )


def document_text(
    name: str, where: str, directory: Path | None, limits: HttpLimits, *, trusted: bool = True
) -> tuple[str, str | None]:
    """The document's text, and the URL it came from (None for a file or inline text).
    `trusted`: the operator's (a principal's fetched document has a smaller bound)."""
    if is_url(where):
        # Documents are larger than tool answers (GitHub's is about 10 MB): a bound of their own.
        bound = replace(
            limits,
            max_response_bytes=MAX_DOCUMENT_BYTES if trusted else limits.document_bytes,
            size_setting="the bound on a source's document"
            if trusted
            else "LOCKGATE_MAX_SOURCE_DOCUMENT_BYTES",
            too_large="keep a smaller document in a file and give its path."
            if trusted
            else "give a smaller document (only the operations your code needs).",
        )
        try:
            fetched = fetch("GET", where, f"fetching its document at {where}", bound)
        except ToolFailed as exc:
            raise InvalidToolSource(f"source {name!r}: {exc.message}") from None
        return fetched.text, fetched.url
    if "\n" in where or where.lstrip().startswith("{"):
        return where, None  # the document itself
    if directory is None and not _looks_like_a_file(where):
        return where, None  # a request's one-line text (an SDL, a JSON document)
    if directory is None:  # a request may not read the server's files
        raise InvalidToolSource(
            f"source {name!r}: give the document's text or its http(s) URL, not a file name",
            hint="Only the operator's sources file may name files on the server.",
        )
    file = directory / where
    try:
        return file.read_text(encoding="utf-8"), None
    except OSError as exc:
        raise InvalidToolSource(
            f"source {name!r}: its document {file} cannot be read ({exc.strerror})"
        ) from None
