"""The tool sources every principal gets, from a TOML file the operator keeps in version
control (`LOCKGATE_SOURCES_FILE`):

    [[openapi]]
    name = "petstore"                  # agent code calls tools.petstore.<operation>(...)
    document = "specs/petstore.yaml"   # a path (relative to this file), a URL, or the text
    base_url = "https://api.example"   # optional: else the document's first server
    auth = { bearer = "petstore_token" }  # optional: a secret (LOCKGATE_SECRET_PETSTORE_TOKEN)
                                          # as bearer, basic ("user:password"), or
                                          # { header = "X-Api-Key", secret = "..." },
                                          # { query = "api_key", secret = "..." }

    [[graphql]]
    name = "shop"                      # tools.shop.query(query=...) and tools.shop.mutate(...)
    endpoint = "https://shop.example/graphql"
    schema = "shop.graphql"            # optional: an SDL file; else asked of the endpoint
    auth = { bearer = "shop_token" }   # optional, as for OpenAPI

    [[mcp]]
    name = "files"                     # tools.files.<upstream tool>(...)
    command = ["npx", "some-mcp-server"]  # run over stdio; or url = "https://.../mcp"
    env = { ROOT = "/srv/files" }      # optional: variables the command gets
    cwd = "servers"                    # optional: where it runs (default: this file's folder)

    [[python]]                         # your own tools (machine.tools.plugins)
    factory = "my_tools:make_source"   # module:callable returning a ToolSource
    options = { region = "eu" }        # optional: keyword arguments for the factory

Read once at start-up; a document that cannot be read or is not OpenAPI 3.0/3.1 stops the
server with a message naming the source, rather than leaving its tools silently missing.
"""

from __future__ import annotations

import logging
import time
import tomllib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from graphql import print_schema
from mcp.client.stdio import StdioServerParameters

from lockgate.machine.secrets import EnvironmentSecrets, MissingSecret, SecretStore
from lockgate.machine.tools.documents import load_document
from lockgate.machine.tools.errors import InvalidToolSource, ToolFailed
from lockgate.machine.tools.graphql_source import (
    GraphQLSource,
    schema_by_introspection,
    schema_from_sdl,
)
from lockgate.machine.tools.http_calls import Auth, HttpLimits, fetch
from lockgate.machine.tools.mcp_source import McpSource, McpUpstream
from lockgate.machine.tools.openapi import OpenApiSource
from lockgate.machine.tools.plugins import factory_source
from lockgate.machine.tools.source_tables import AUTH_FORMS, SOURCE_KINDS, Origin
from lockgate.machine.tools.spec import ToolSource, is_identifier

log = logging.getLogger("lockgate.sources")

#: The largest document (OpenAPI, SDL) an operator's source may be fetched from a URL (a
#: principal's: `LOCKGATE_MAX_SOURCE_DOCUMENT_BYTES`, `HttpLimits.document_bytes`).
MAX_DOCUMENT_BYTES = 64 * 1024 * 1024


def load_sources(
    path: Path, limits: HttpLimits, secrets: SecretStore | None = None
) -> list[ToolSource]:
    """`secrets` resolve a GraphQL source's credential for its introspection at start-up."""
    try:
        config = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InvalidToolSource(
            f"the sources file {path} cannot be read ({exc.strerror})",
            hint="Check LOCKGATE_SOURCES_FILE.",
        ) from None
    except tomllib.TOMLDecodeError as exc:
        raise InvalidToolSource(f"the sources file {path} is not valid TOML: {exc}") from None
    unknown = sorted(set(config) - {"openapi", "graphql", "mcp", "python"})
    if unknown:
        raise InvalidToolSource(
            f"the sources file {path} has unknown sections: {', '.join(unknown)}",
            hint="Each source is an [[openapi]], [[graphql]], [[mcp]] or [[python]] table.",
        )
    origin = Origin(f"the sources file {path}", path.parent)
    made: list[ToolSource] = []
    for kind in SOURCE_KINDS:
        for entry in config.get(kind, []):
            # Said as each one loads, so a start with a large API is never silent for long.
            log.info("loading %s source %r", kind, entry.get("name"))
            began = time.monotonic()
            made.append(build_source(kind, entry, origin, limits, secrets))
            log.info(
                "loaded %s source %r: %d tools in %.1f s",
                kind,
                made[-1].name,
                len(made[-1].tools()),
                time.monotonic() - began,
            )
    for number, entry in enumerate(config.get("python", []), start=1):
        made.append(_python(entry, f"[[python]] number {number} of {path}"))
    return made


def build_source(
    kind: str,
    entry: Mapping[str, Any],
    origin: Origin,
    limits: HttpLimits,
    secrets: SecretStore | None = None,
) -> ToolSource:
    """The source an [[openapi]], [[graphql]] or [[mcp]] table describes."""
    with _in_words(entry):
        if kind == "openapi":
            return _openapi(entry, origin, limits)
        if kind == "graphql":
            return _graphql(entry, origin, limits, secrets)
        if kind == "mcp":
            return _mcp(entry, origin, limits)
    raise InvalidToolSource(f"{origin}: unknown kind of source {kind!r}", hint=_KINDS_HINT)


@contextmanager
def _in_words(entry: Mapping[str, Any]) -> Iterator[None]:
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


_KINDS_HINT = "A source is openapi, graphql or mcp."


def settled_source(
    kind: str,
    entry: Mapping[str, Any],
    origin: Origin,
    limits: HttpLimits,
    secrets: SecretStore | None = None,
) -> tuple[dict[str, Any], ToolSource]:
    """The source `entry` describes, and `entry` as it is stored: what was fetched to build
    it kept as text (an OpenAPI document, a GraphQL schema from introspection), with the
    base URL it resolved to, so every instance builds the same tools from it and fetches
    nothing."""
    config = dict(entry)
    if kind == "openapi":
        name = _named(entry, origin, "openapi", {"document", "base_url", "auth"})
        where = entry.get("document")
        if isinstance(where, str) and where.strip():
            text, url = _document_text(
                name, where, origin.directory, limits, trusted=origin.commands
            )
            config["document"] = text
            with _in_words(entry):
                source = _openapi(config, origin, limits, document_url=url)
            config["base_url"] = source.base_url
            return config, source
    if kind == "mcp" and "command" in config:  # stored: the directory it runs in, settled
        directory = _directory(origin, config.get("cwd"))
        if directory is not None:
            config["cwd"] = str(directory.resolve())
    made = build_source(kind, config, origin, limits, secrets)
    if isinstance(made, GraphQLSource) and "schema" not in config:
        config["schema"] = print_schema(made.schema)
    return config, made


def _python(entry: Mapping[str, Any], where: str) -> ToolSource:
    extra = sorted(set(entry) - {"factory", "options"})
    if extra:
        raise InvalidToolSource(
            f"{where}: unknown keys {', '.join(extra)}",
            hint="A [[python]] source has factory and options.",
        )
    factory, options = entry.get("factory"), entry.get("options", {})
    if not isinstance(factory, str):
        raise InvalidToolSource(f'{where} has no factory ("module:callable")')
    if not isinstance(options, Mapping):
        raise InvalidToolSource(f"{where}: options must be a table")
    return factory_source(factory, options, where)


def _named(entry: Mapping[str, Any], path: Origin, kind: str, keys: set[str]) -> str:
    """The source's name, once its table holds only `keys` (and a name)."""
    name = entry.get("name")
    if not isinstance(name, str) or not is_identifier(name):
        raise InvalidToolSource(
            f"{path}: a [[{kind}]] source needs a name that is a Python identifier (got {name!r})",
            hint="Agent code calls tools.<name>.<tool>(...).",
        )
    extra = sorted(set(entry) - keys - {"name"})
    if extra:
        raise InvalidToolSource(
            f"source {name!r} in {path}: unknown keys {', '.join(extra)}",
            hint=f"A [[{kind}]] source has name, {', '.join(sorted(keys))}.",
        )
    return name


def _graphql(
    entry: Mapping[str, Any], path: Origin, limits: HttpLimits, secrets: SecretStore | None
) -> GraphQLSource:
    name = _named(entry, path, "graphql", {"endpoint", "schema", "auth"})
    endpoint = entry.get("endpoint")
    if not isinstance(endpoint, str) or not endpoint.startswith(("http://", "https://")):
        raise InvalidToolSource(f"source {name!r} in {path}: endpoint must be an http(s) URL")
    auth = _auth(name, entry.get("auth"), path)
    sdl = entry.get("schema")
    if sdl is not None:
        if not isinstance(sdl, str):
            raise InvalidToolSource(f"source {name!r} in {path}: schema must be a file name")
        text, _ = _document_text(name, sdl, path.directory, limits)
        schema = schema_from_sdl(name, text)
    else:
        values: dict[str, str] = {}
        if auth is not None:
            store = secrets if secrets is not None else EnvironmentSecrets()
            try:
                values = store.resolve([auth.secret], source=name)
            except MissingSecret as exc:
                raise InvalidToolSource(
                    f"source {name!r}: its introspection needs {exc.message}", hint=exc.hint
                ) from None
        schema = schema_by_introspection(name, endpoint, limits, auth, values)
    return GraphQLSource(name, endpoint, schema, limits=limits, auth=auth)


def _mcp(entry: Mapping[str, Any], path: Origin, limits: HttpLimits) -> McpSource:
    name = _named(entry, path, "mcp", {"command", "url", "env", "cwd"})
    command, url, env = entry.get("command"), entry.get("url"), entry.get("env")
    cwd = entry.get("cwd")
    if cwd is not None and not isinstance(cwd, str):
        raise InvalidToolSource(f"source {name!r} in {path}: cwd must be a directory's path")
    if env is not None and not (
        isinstance(env, Mapping) and all(isinstance(v, str) for v in env.values())
    ):
        raise InvalidToolSource(f"source {name!r} in {path}: env must be a table of strings")
    target: StdioServerParameters | str
    if isinstance(url, str) and command is None and url.startswith(("http://", "https://")):
        target = url
    elif not path.commands and command is not None:
        # A command runs on this server: only an operator, who can run commands here
        # anyway, may name one (the sources file, `lockgate sources add`), never a request.
        raise InvalidToolSource(
            f"source {name!r} in {path}: a command cannot be given here; give the url of a "
            "streamable HTTP MCP server",
            hint="An operator can add an MCP server run over stdio with `lockgate sources add`.",
        )
    elif (
        url is None
        and isinstance(command, list)
        and command
        and all(isinstance(part, str) and part for part in command)
    ):
        # Run in `cwd`, relative to the sources file as its other paths are (default: the
        # file's directory). The SDK passes the command only a safe part of this
        # environment (PATH, HOME...); `env` adds to it.
        target = StdioServerParameters(
            command=command[0],
            args=command[1:],
            cwd=_directory(path, cwd),
            env=dict(env or {}),
        )
    else:
        raise InvalidToolSource(
            f"source {name!r} in {path}: give either command (a list: the program and its "
            "arguments, run over stdio) or url (a streamable HTTP endpoint)"
        )
    upstream = McpUpstream(
        name,
        target,
        limits.timeout_secs,
        reach=limits.reach,
        max_answer_bytes=limits.max_response_bytes,
    )
    try:
        return McpSource(name, upstream)
    except ToolFailed as exc:
        upstream.close()
        raise InvalidToolSource(f"source {name!r}: {exc.message}") from None


def _directory(origin: Origin, cwd: str | None) -> Path | None:
    if cwd is None:
        return origin.directory
    return Path(cwd) if origin.directory is None else origin.directory / cwd


def _openapi(
    entry: Mapping[str, Any], path: Origin, limits: HttpLimits, document_url: str | None = None
) -> OpenApiSource:
    """`document_url`: where the document (given as text) was fetched from, which its
    relative server URLs are relative to."""
    name = _named(entry, path, "openapi", {"document", "base_url", "auth"})
    where = entry.get("document")
    if not isinstance(where, str) or not where.strip():
        raise InvalidToolSource(f"source {name!r} in {path} has no document")
    base_url = entry.get("base_url")
    if base_url is not None and not isinstance(base_url, str):
        raise InvalidToolSource(f"source {name!r} in {path}: base_url must be a string")
    text, url = _document_text(name, where, path.directory, limits)
    url = url or document_url
    document = load_document(text, name=name, trusted=path.commands)
    if not isinstance(document, Mapping):
        raise InvalidToolSource(f"source {name!r}: its document is not a JSON or YAML object")
    auth = _auth(name, entry.get("auth"), path)
    return OpenApiSource(
        name, document, base_url=base_url, document_url=url, limits=limits, auth=auth
    )


def _auth(name: str, table: object, path: Origin) -> Auth | None:
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


def _looks_like_a_file(where: str) -> bool:
    return not any(c.isspace() for c in where) and (
        "/" in where or where.endswith((".json", ".yaml", ".yml", ".graphql", ".gql"))
    )


def _document_text(
    name: str, where: str, directory: Path | None, limits: HttpLimits, *, trusted: bool = True
) -> tuple[str, str | None]:
    """The document's text, and the URL it came from (None for a file or inline text).
    `trusted`: the operator's (a principal's fetched document has a smaller bound)."""
    if where.startswith(("http://", "https://")):
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
