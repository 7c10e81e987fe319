"""Real `lockgate serve` processes on loopback, and real MCP clients talking to them.

The pytest plugin behind the server tests, and the one place they import its helpers
from; the code lives in modules with one job each and is re-exported here:

- `lockgate_server`: one server process (`LockgateServer`): its URLs, its banner and JSON
  logs (read back from files, so nothing is left as an unclosed pipe), readiness, stopping.
- `server_deployment`: one database plus one notes directory (`Deployment`), the servers and
  `lockgate keys ...` commands it starts on it, and how the database of each kind is made.
- `mcp_calls`: the real SDK client (`mcp_client`) and the readers and drivers of its tool
  results (`structured`, `pause`, `settle`, ...).
- `raw_mcp`: hand-built JSON-RPC over HTTP (`RawMCP`), for what a well-behaved client
  never sends.
- `server_fixtures`: the fixtures. `shared` is one server per database kind for the whole
  session (the fast tests share it, each with its own executions and note keys), `short` a
  second one with a 0.2 s wait budget and a 1 s approval TTL (both come from `fleet`, which
  starts them side by side); `deployment` is a fresh database per test for the tests that
  start, kill and restart their own servers.

Nothing here sleeps to hide a race: every wait polls a condition with a deadline.

Test modules load the fixtures with `pytest_plugins = ["tests.support.servers"]`, so each
is defined once for the session (a session fixture imported into several modules would
be several fixtures, each starting its own servers); that is why they are imported here
rather than from `server_fixtures` by each test module. The tests also import helpers from
here before pytest registers the plugin, hence PYTEST_DONT_REWRITE: pytest would warn that
this module was imported before it could rewrite its asserts (the helpers' asserts carry
their own messages).
"""

from __future__ import annotations

from tests.support.lockgate_server import (
    KEY_PATTERN,
    LOCKGATE,
    START_TIMEOUT,
    LockgateServer,
    listening,
)
from tests.support.mcp_calls import (
    MODES,
    mcp_client,
    pause,
    paused_write,
    run,
    settle,
    structured,
    text_of,
    unique_key,
    write_code,
    writes_of,
)
from tests.support.raw_mcp import ACCEPT, MODERN, MODERN_META, RawMCP, rpc_body
from tests.support.server_deployment import (
    Command,
    Deployment,
    Key,
    make_deployment,
    new_database_url,
)
from tests.support.server_fixtures import (
    DATABASES,
    SHARED_SETTINGS,
    SHORT_SETTINGS,
    Fleet,
    SharedServer,
    create_key_directly,
    deployment_fixture,
    fleet_fixture,
    shared_fixture,
    short_fixture,
)

__all__ = [
    "ACCEPT",
    "DATABASES",
    "KEY_PATTERN",
    "LOCKGATE",
    "MODERN",
    "MODERN_META",
    "MODES",
    "SHARED_SETTINGS",
    "SHORT_SETTINGS",
    "START_TIMEOUT",
    "Command",
    "Deployment",
    "Fleet",
    "Key",
    "LockgateServer",
    "RawMCP",
    "SharedServer",
    "create_key_directly",
    "deployment_fixture",
    "fleet_fixture",
    "listening",
    "make_deployment",
    "mcp_client",
    "new_database_url",
    "pause",
    "paused_write",
    "rpc_body",
    "run",
    "settle",
    "shared_fixture",
    "short_fixture",
    "structured",
    "text_of",
    "unique_key",
    "write_code",
    "writes_of",
]
