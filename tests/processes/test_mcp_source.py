"""An upstream MCP server as a tool source: the SDK's own MCPServer run over stdio by the
source, its tools proxied with their schemas and annotations deciding what needs a person,
its failures in words, and a lost upstream connected again on the next call."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from lockgate.machine.engine import Action
from lockgate.machine.policy import PolicyDecision
from lockgate.machine.runtime import Runtime
from lockgate.machine.tools.errors import InvalidToolSource
from lockgate.machine.tools.http_calls import HttpLimits
from lockgate.machine.tools.mcp_source import McpSource
from lockgate.machine.tools.source_file import load_sources
from lockgate.spec import ExecutionStatus
from tests.support.engine_records import MakeRuntime

ROOT = Path(__file__).resolve().parents[2]


def sources_file(tmp_path: Path) -> Path:
    command = [sys.executable, "-m", "tests.support.upstream_mcp", str(tmp_path / "effects")]
    path = tmp_path / "sources.toml"
    env = f"{{ PYTHONPATH = {json.dumps(str(ROOT))} }}"  # so it finds tests.support
    path.write_text(f'[[mcp]]\nname = "up"\ncommand = {json.dumps(command)}\nenv = {env}\n')
    return path


@pytest.fixture(name="rt")
def rt_fixture(make_runtime: MakeRuntime, tmp_path: Path) -> Iterator[Runtime]:
    rt = make_runtime(sources_file=sources_file(tmp_path))
    yield rt
    rt.close_sources()


def effects(tmp_path: Path) -> list[dict[str, int]]:
    file = tmp_path / "effects"
    return [json.loads(line) for line in file.read_text().splitlines()] if file.exists() else []


def upstream_of(rt: Runtime) -> McpSource:
    [source] = [s for s in rt.sources if isinstance(s, McpSource)]
    return source


def test_the_upstream_tools_are_listed_with_what_their_hints_ask(rt: Runtime) -> None:
    specs = {t.spec.name: t.spec for t in upstream_of(rt).tools()}
    assert sorted(specs) == ["delete_thing", "fail", "lookup", "pid", "plain_tool"]
    assert specs["lookup"].idempotent and specs["lookup"].default_policy is PolicyDecision.APPROVE
    for name in ("delete_thing", "plain_tool"):  # destructive, and unannotated
        assert not specs[name].idempotent
        assert specs[name].default_policy is PolicyDecision.REQUIRE_APPROVAL
    assert specs["lookup"].bare_signature() == "tools.up.lookup(key: str) -> Any"
    assert specs["lookup"].description == "Look a key up (read-only)."


def test_a_read_is_made_at_once_through_the_upstream(rt: Runtime) -> None:
    done = rt.engine.execute("alice", 'tools.up.lookup(key="abc")')
    assert done.status is ExecutionStatus.COMPLETED, done.error
    assert done.result == {"key": "abc", "value": "ABC"}


def test_a_destructive_call_waits_for_a_person_then_is_made_once(
    rt: Runtime, tmp_path: Path
) -> None:
    paused = rt.engine.execute("alice", "tools.up.delete_thing(thing_id=7)")
    assert paused.status is ExecutionStatus.WAITING_FOR_INTERACTION
    assert effects(tmp_path) == []
    done = rt.engine.resume(paused.id, "alice", Action.ACCEPT)
    assert done.result == {"result": "deleted 7"}, done.error
    assert effects(tmp_path) == [{"deleted": 7}]


def test_the_upstream_schema_is_enforced_before_any_pause(rt: Runtime, tmp_path: Path) -> None:
    code = (
        "try:\n    tools.up.delete_thing(thing_id='x')\nexcept TypeError as e:\n    r = str(e)\nr"
    )
    done = rt.engine.execute("alice", code)
    assert (
        done.result == "tools.up.delete_thing: argument 'thing_id' must be an integer, got string"
    )
    assert done.calls == [] and effects(tmp_path) == []


def test_an_upstream_failure_and_a_lost_upstream_reach_the_code_in_words(rt: Runtime) -> None:
    failed = rt.engine.execute(
        "alice", "try:\n    tools.up.fail()\nexcept RuntimeError as e:\n    r = str(e)\nr"
    )
    assert isinstance(failed.result, str)
    assert failed.result.startswith("tools.up.fail failed: the upstream tool 'fail' failed: ")
    assert "the upstream refuses" in failed.result
    # The upstream dies between calls: the next call says so, the one after connects again.
    first = rt.engine.execute("alice", "tools.up.pid()")
    assert isinstance(first.result, dict)
    pid = first.result["result"]
    assert isinstance(pid, int)
    os.kill(pid, signal.SIGKILL)
    lost = rt.engine.execute(
        "alice", "try:\n    tools.up.pid()\nexcept RuntimeError as e:\n    r = str(e)\nr"
    )
    assert isinstance(lost.result, str) and "the next call connects again" in lost.result
    again = rt.engine.execute("alice", "tools.up.pid()")
    assert isinstance(again.result, dict) and again.result["result"] != first.result["result"]


def test_an_upstream_that_cannot_start_is_refused_at_start(tmp_path: Path) -> None:
    path = tmp_path / "sources.toml"
    path.write_text('[[mcp]]\nname = "up"\ncommand = ["/nonexistent/upstream"]\n')
    with pytest.raises(InvalidToolSource, match="source 'up': the upstream MCP server 'up' cannot"):
        load_sources(path, HttpLimits(timeout_secs=10))
