"""The documented client configurations (docs/clients.md) parse, and each has the shape its
client documents: Claude Code (`claude mcp add --transport http ... --header`, `.mcp.json`
with `type: http`), Claude Desktop (a stdio bridge, `mcp-remote`, with the header), Cursor
(`url` and `headers`), VS Code (`servers` with `type: http`, the key from a password input).
The README shows Claude Code's alone, the same as the page's."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
HEADING = "## Claude Code, Claude Desktop, Cursor and VS Code"
README_HEADING = "## Connecting a client"


def section(page: str, heading: str) -> str:
    text = (ROOT / page).read_text()
    start = text.index(heading)
    return text[start : text.index("\n## ", start + len(heading))]


def blocks(language: str, page: str = "docs/clients.md", heading: str = HEADING) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", section(page, heading), flags=re.S)


def test_every_client_configuration_has_its_documented_shape() -> None:
    [command] = blocks("sh")
    args = shlex.split(command)
    assert args[:6] == ["claude", "mcp", "add", "--transport", "http", "lockgate"]
    assert args[6].endswith("/mcp") and args[7:] == ["--header", "Authorization: Bearer <key>"]

    code, desktop, cursor, vscode = (json.loads(b) for b in blocks("json"))
    server: Any = code["mcpServers"]["lockgate"]
    assert server["type"] == "http" and server["url"].endswith("/mcp")
    assert server["headers"]["Authorization"].startswith("Bearer ")

    bridge = desktop["mcpServers"]["lockgate"]
    assert bridge["command"] == "npx" and "mcp-remote" in bridge["args"]
    header = bridge["args"][bridge["args"].index("--header") + 1]
    assert header == "Authorization:${LOCKGATE_AUTH}" and " " not in header
    assert bridge["env"]["LOCKGATE_AUTH"].startswith("Bearer ")

    remote = cursor["mcpServers"]["lockgate"]
    assert remote["url"].endswith("/mcp") and "Authorization" in remote["headers"]

    [asked] = vscode["inputs"]
    assert asked["type"] == "promptString" and asked["password"] is True
    entry = vscode["servers"]["lockgate"]
    assert entry["type"] == "http"
    assert entry["headers"]["Authorization"] == f"Bearer ${{input:{asked['id']}}}"


def test_the_readme_shows_claude_code_s_configuration_as_the_page_does() -> None:
    [command] = blocks("sh", "README.md", README_HEADING)
    [config] = blocks("json", "README.md", README_HEADING)
    assert command == blocks("sh")[0]
    assert json.loads(config) == json.loads(blocks("json")[0])
