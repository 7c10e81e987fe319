"""`[[mcp]]`: an upstream MCP server, run over stdio (the operator's only) or reached over
streamable HTTP, its tools proxied with their own schemas."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lockgate.machine.tools.errors import InvalidToolSource, ToolFailed
from lockgate.machine.tools.source_entries import is_url, named
from lockgate.machine.tools.source_kind import (
    NAME_ARGUMENT,
    CommandLine,
    SourceKind,
    admin_tool,
    arguments,
)
from lockgate.machine.tools.source_tables import Origin

if TYPE_CHECKING:
    from lockgate.machine.secrets import SecretStore
    from lockgate.machine.tools.http_calls import HttpLimits
    from lockgate.machine.tools.mcp_source import McpSource

KEYS = ("command", "url", "env", "cwd")


def _directory(origin: Origin, cwd: str | None) -> Path | None:
    if cwd is None:
        return origin.directory
    return Path(cwd) if origin.directory is None else origin.directory / cwd


def build(
    entry: Mapping[str, Any], origin: Origin, limits: HttpLimits, secrets: SecretStore | None
) -> McpSource:
    from mcp.client.stdio import StdioServerParameters

    from lockgate.machine.tools.mcp_source import McpSource, McpUpstream

    name = named(entry, origin, "mcp", KEYS)
    command, url, env = entry.get("command"), entry.get("url"), entry.get("env")
    cwd = entry.get("cwd")
    if cwd is not None and not isinstance(cwd, str):
        raise InvalidToolSource(f"source {name!r} in {origin}: cwd must be a directory's path")
    if env is not None and not (
        isinstance(env, Mapping) and all(isinstance(v, str) for v in env.values())
    ):
        raise InvalidToolSource(f"source {name!r} in {origin}: env must be a table of strings")
    target: StdioServerParameters | str
    if isinstance(url, str) and command is None and is_url(url):
        target = url
    elif not origin.commands and command is not None:
        # A command runs on this server: only an operator, who can run commands here
        # anyway, may name one (the sources file, `lockgate sources add`), never a request.
        raise InvalidToolSource(
            f"source {name!r} in {origin}: a command cannot be given here; give the url of a "
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
            cwd=_directory(origin, cwd),
            env=dict(env or {}),
        )
    else:
        raise InvalidToolSource(
            f"source {name!r} in {origin}: give either command (a list: the program and its "
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


def settle(
    entry: Mapping[str, Any], origin: Origin, limits: HttpLimits, secrets: SecretStore | None
) -> tuple[dict[str, Any], McpSource]:
    """Stored with the directory its command runs in made absolute."""
    config = dict(entry)
    if "command" in config:
        directory = _directory(origin, config.get("cwd"))
        if directory is not None:
            config["cwd"] = str(directory.resolve())
    return config, build(config, origin, limits, secrets)


def _command_line(given: CommandLine) -> dict[str, Any]:
    if is_url(given.target):
        entry: dict[str, Any] = {"url": given.target}
    else:  # run in the current directory, as a shell would
        entry = {"command": shlex.split(given.target), "cwd": given.cwd}
    if given.env:
        entry["env"] = dict(given.env)
    return entry


ADD = admin_tool(
    "add_mcp_source",
    "Add an upstream MCP server (streamable HTTP) as a source: its tools become "
    "tools.<name>.<tool>(...). Returns {name, kind, scope, tools}.",
    arguments(["name", "url"], name=NAME_ARGUMENT, url={"type": "string", "pattern": "^https?://"}),
    read=False,
)

MCP = SourceKind(
    name="mcp",
    keys=KEYS,
    about="an upstream MCP server, its tools proxied",
    build=build,
    settle=settle,
    add_tool=ADD,
    command_line=_command_line,
    target_help="the server's URL, or the command that runs it over stdio (one string, split "
    "as a shell would; --env KEY=VALUE for its environment)",
)
