"""What Lockgate relies on in the `mcp` SDK beyond its public API.

`server/durable_sessions.py` subclasses the SDK's `StreamableHTTPSessionManager` and uses its
private session bookkeeping, so `mcp` is pinned to one version. These tests are the contract:
an upgrade that renames, removes or stops calling any of it fails here with a message naming
what moved and what depends on it, rather than as a session that silently stops surviving a
restart.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from mcp.server import Server
from mcp.server.connection import Connection
from mcp.server.runner import serve_connection
from mcp.server.streamable_http import StreamableHTTPServerTransport
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.jsonrpc_dispatcher import JSONRPCDispatcher

from lockgate.server.durable_sessions import DurableSessionManager

ROOT = Path(__file__).resolve().parents[2]
WHY = "server/durable_sessions.py depends on it; re-check that module before upgrading mcp"


def pinned(distribution: str) -> str:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    requirement: str
    for requirement in project["project"]["dependencies"]:
        name, _, version = requirement.partition("==")
        if name.strip() == distribution:
            return str(version).strip()
    pytest.fail(f"{distribution} is not pinned with == in pyproject.toml ({WHY})")


def parameters(function: Callable[..., Any]) -> list[str]:
    return [p for p in inspect.signature(function).parameters if p != "self"]


def source_of(function: Callable[..., Any]) -> str:
    return inspect.getsource(function)


def test_the_installed_sdk_is_the_pinned_one() -> None:
    version = pinned("mcp")
    assert importlib.metadata.version("mcp") == version, f"mcp is not {version}: {WHY}"
    assert importlib.metadata.version("mcp-types") == version, f"mcp-types is not {version}"


def test_the_session_manager_keeps_the_bookkeeping_the_subclass_reads() -> None:
    manager = StreamableHTTPSessionManager(Server("contract"), retry_interval=3000)
    expected = {
        "_server_instances": dict,
        "_session_owners": dict,
    }
    for name, kind in expected.items():
        assert isinstance(getattr(manager, name, None), kind), f"{name} moved: {WHY}"
    for name in ("_session_creation_lock", "_task_group", "_lifespan_state"):
        assert hasattr(manager, name), f"StreamableHTTPSessionManager.{name} is gone: {WHY}"
    for name in (
        "app",
        "json_response",
        "security_settings",
        "retry_interval",
        "session_idle_timeout",
        "max_sessions",
    ):
        assert hasattr(manager, name), f"StreamableHTTPSessionManager.{name} is gone: {WHY}"


@pytest.mark.parametrize(
    ("method", "expected"),
    [
        ("_handle_stateful_request", ["scope", "receive", "send"]),
        ("_admit_session", ["requestor"]),
        ("_discard_session", ["session_id", "transport"]),
    ],
)
def test_the_overridden_methods_keep_their_signatures(method: str, expected: list[str]) -> None:
    original = getattr(StreamableHTTPSessionManager, method, None)
    assert original is not None, f"StreamableHTTPSessionManager.{method} is gone: {WHY}"
    assert parameters(original) == expected, f"{method} changed its parameters: {WHY}"
    override = getattr(DurableSessionManager, method)
    assert parameters(override) == expected


def test_the_sdk_still_calls_what_the_subclass_overrides() -> None:
    """An override the SDK no longer calls is dead code: revival and per-session replay
    logs would quietly stop working."""
    dispatch = source_of(StreamableHTTPSessionManager._handle_request)
    assert "self._handle_stateful_request(" in dispatch, (
        f"_handle_request no longer routes through _handle_stateful_request: {WHY}"
    )
    stateful = source_of(StreamableHTTPSessionManager._handle_stateful_request)
    assert "self._admit_session(" in stateful, (
        f"new sessions are no longer admitted by _admit_session: {WHY}"
    )
    assert "self._server_instances" in stateful, (
        f"sessions are no longer looked up in _server_instances: {WHY}"
    )
    discard = source_of(StreamableHTTPSessionManager._discard_session)
    assert "_server_instances.pop(" in discard, f"_discard_session no longer forgets: {WHY}"


def test_the_transport_still_mints_priming_events_where_the_subclass_widens_them() -> None:
    """`PrimingTransport` primes 2025-06-18 and 2025-03-26 streams through the SDK's own
    minting: it must still exist, take the stream and the version, and be called for a
    POST's stream and a resumed one."""
    mint = getattr(StreamableHTTPServerTransport, "_mint_priming_event", None)
    assert mint is not None, f"StreamableHTTPServerTransport._mint_priming_event is gone: {WHY}"
    assert parameters(mint) == ["stream_id", "protocol_version"], WHY
    calls = inspect.getsource(StreamableHTTPServerTransport).count("self._mint_priming_event(")
    assert calls >= 2, f"the SDK no longer primes through _mint_priming_event: {WHY}"


def test_the_transport_and_connection_take_what_a_revival_passes() -> None:
    transport = parameters(StreamableHTTPServerTransport.__init__)
    for name in (
        "mcp_session_id",
        "is_json_response_enabled",
        "event_store",
        "security_settings",
        "retry_interval",
        "idle_timeout",
    ):
        assert name in transport, f"StreamableHTTPServerTransport lost {name!r}: {WHY}"
    made = StreamableHTTPServerTransport(mcp_session_id="contract", idle_timeout=60)
    assert hasattr(made, "idle_scope") and callable(made.connect), f"transport changed: {WHY}"
    assert "inline_methods" in parameters(JSONRPCDispatcher.__init__), WHY
    # Passed positionally (the dispatcher) and by keyword (the rest).
    for_loop = inspect.signature(Connection.for_loop).parameters
    assert next(iter(for_loop)) != "session_id" and "session_id" in for_loop, WHY
    serve = parameters(serve_connection)
    assert len(serve) >= 2 and {"connection", "lifespan_state"} <= set(serve[2:]), WHY


def test_a_revived_connection_is_restored_through_these_attributes() -> None:
    """The revival sets these on a fresh Connection instead of replaying `initialize`."""
    restored = {"client_params", "protocol_version", "initialized"}
    annotations: set[str] = set()
    for cls in Connection.__mro__:
        annotations |= set(getattr(cls, "__annotations__", {}))
    init = source_of(Connection.__init__)
    missing = {name for name in restored if name not in annotations and f"self.{name}" not in init}
    assert not missing, f"Connection no longer has {sorted(missing)}: {WHY}"
