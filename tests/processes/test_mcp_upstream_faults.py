"""An upstream MCP server that goes away: before a write is sent (it waited for a person and
its upstream died meanwhile: the write is made on a new connection, the approval not spent
for nothing), and while a call is in flight (a write's outcome is unknown: the call is left
in doubt as recovery leaves one; a read fails in words as before); and an upstream's images,
sounds and resources as agent code gets them. Real stdio upstreams
(`tests.support.upstream_mcp_faults`), killed for real."""

from __future__ import annotations

import base64
import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from lockgate.machine.engine import Action
from lockgate.machine.runtime import Runtime
from lockgate.server import shapes
from lockgate.spec import ExecutionStatus
from tests.support.engine_records import MakeRuntime
from tests.support.polling import wait_for

ROOT = Path(__file__).resolve().parents[2]
#: The bytes of the images and sounds the upstream answers (`upstream_mcp_faults.PIXELS`).
PIXELS = bytes(range(256)) * 4


def sources_file(tmp_path: Path) -> Path:
    module = "tests.support.upstream_mcp_faults"
    command = [sys.executable, "-m", module, str(tmp_path / "effects")]
    path = tmp_path / "sources.toml"
    env = f"{{ PYTHONPATH = {json.dumps(str(ROOT))} }}"  # so it finds tests.support
    path.write_text(f'[[mcp]]\nname = "up"\ncommand = {json.dumps(command)}\nenv = {env}\n')
    return path


@pytest.fixture(name="rt")
def rt_fixture(make_runtime: MakeRuntime, tmp_path: Path) -> Iterator[Runtime]:
    rt = make_runtime(sources_file=sources_file(tmp_path))
    yield rt
    rt.close_sources()


def effects(tmp_path: Path) -> list[dict[str, int | str]]:
    file = tmp_path / "effects"
    return [json.loads(line) for line in file.read_text().splitlines()] if file.exists() else []


def dead(pid: int) -> bool:
    """Whether process `pid` has ended (gone, or a zombie its parent has not reaped yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):  # reaped before, or between open and read
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def upstream_pid(rt: Runtime) -> int:
    done = rt.engine.execute("alice", "tools.up.pid()")
    assert done.status is ExecutionStatus.COMPLETED, done.error
    assert isinstance(done.result, dict)
    pid = done.result["result"]
    assert isinstance(pid, int)
    return pid


def test_a_write_whose_upstream_died_while_it_waited_is_made_on_a_new_connection(
    rt: Runtime, tmp_path: Path
) -> None:
    first = upstream_pid(rt)
    paused = rt.engine.execute("alice", "tools.up.delete_thing(thing_id=7)")
    assert paused.status is ExecutionStatus.WAITING_FOR_INTERACTION
    os.kill(first, signal.SIGKILL)
    wait_for(lambda: dead(first), "the upstream to die")
    done = rt.engine.resume(paused.id, "alice", Action.ACCEPT)
    assert done.status is ExecutionStatus.COMPLETED, done.error
    assert done.result == {"result": "deleted 7"}
    [made] = effects(tmp_path)
    assert made["deleted"] == 7 and made["pid"] != first  # made once, by a new upstream
    assert upstream_pid(rt) == made["pid"]


def test_images_sounds_and_resources_reach_the_code_as_typed_parts(rt: Runtime) -> None:
    done = rt.engine.execute("alice", "tools.up.media()")
    assert done.status is ExecutionStatus.COMPLETED, done.error
    data = base64.b64encode(PIXELS).decode()
    assert done.result == [
        {"type": "text", "text": "a caption"},
        {"type": "image", "mime_type": "image/png", "data": data},
        {"type": "audio", "mime_type": "audio/wav", "data": data},
        {"type": "resource", "uri": "file:///notes/a.txt", "mime_type": "text/plain", "text": "hi"},
        {
            "type": "resource",
            "uri": "file:///blobs/b.bin",
            "mime_type": "application/octet-stream",
            "blob": data,
        },
        {
            "type": "resource_link",
            "uri": "file:///big/c.csv",
            "name": "c.csv",
            "title": None,
            "description": None,
            "mime_type": "text/csv",
        },
    ]
    # Text alone is still text, its parts joined, as it always was.
    assert rt.engine.execute("alice", "tools.up.two_texts()").result == "one\ntwo"


def test_an_image_too_large_is_refused_in_words(rt: Runtime) -> None:
    code = (
        "try:\n    r = tools.up.big_image(size=2_000_000)\nexcept RuntimeError as e:\n"
        "    r = str(e)\nr"
    )
    done = rt.engine.execute("alice", code)
    assert done.status is ExecutionStatus.COMPLETED, done.error
    assert isinstance(done.result, str)
    assert done.result.startswith("tools.up.big_image failed: the upstream tool 'big_image' ")
    assert "more than 1048576 (LOCKGATE_HTTP_MAX_RESPONSE_BYTES); ask it for less" in done.result
    # Within that bound but past the result's own (LOCKGATE_MAX_RESULT_BYTES), the code
    # gets the truncation marker every tool's result gets.
    cut = rt.engine.execute("alice", "tools.up.big_image(size=100_000)")
    assert isinstance(cut.result, dict) and cut.result["truncated"] is True


def test_a_write_whose_upstream_dies_mid_call_is_left_in_doubt(rt: Runtime, tmp_path: Path) -> None:
    paused = rt.engine.execute("alice", "tools.up.delete_and_die(thing_id=9)")
    assert paused.status is ExecutionStatus.WAITING_FOR_INTERACTION
    done = rt.engine.resume(paused.id, "alice", Action.ACCEPT)
    [made] = effects(tmp_path)
    assert made["deleted"] == 9  # it ran, and nobody here can know it
    # As recovery leaves a call whose instance died after dispatching it: in doubt, named.
    assert done.status is ExecutionStatus.INTERRUPTED
    assert [(c.tool, c.status) for c in done.calls] == [("up.delete_and_die", "in_doubt")]
    assert isinstance(done.what_ran, dict)
    assert done.what_ran["in_doubt"] == [{"seq": 1, "tool": "up.delete_and_die"}]
    cause = (
        "the upstream MCP server 'up' closed the connection after the call was sent, before "
        "answering: whether the call took effect is unknown"
    )
    assert done.what_ran["cause"] == cause
    answer = shapes.execution(done, None)
    assert answer.is_error and answer.structured_content is not None
    assert answer.structured_content["executionStatus"] == "interrupted"
    assert answer.structured_content["error"] == {
        "code": "interrupted",
        "message": f"Execution {done.id!r} was interrupted: {cause}. Going on could have "
        "repeated that call; see what_ran for the calls that completed and the call in doubt.",
        "hint": "Check whether the call in doubt took effect before running the code again.",
        "what_ran": done.what_ran,
    }
    # The source connects again for the next call.
    assert upstream_pid(rt) != made["pid"]


def test_a_read_whose_upstream_dies_mid_call_fails_in_words_as_before(
    rt: Runtime, tmp_path: Path
) -> None:
    code = "try:\n    tools.up.look_and_die(key='k')\nexcept RuntimeError as e:\n    r = str(e)\nr"
    done = rt.engine.execute("alice", code)
    assert done.status is ExecutionStatus.COMPLETED, done.error
    assert isinstance(done.result, str)
    assert done.result.startswith("tools.up.look_and_die failed: the upstream MCP server 'up' ")
    assert done.result.endswith("the next call connects again")
    assert [(c.tool, c.status) for c in done.calls] == [("up.look_and_die", "failed")]
    assert [e["looked"] for e in effects(tmp_path)] == ["k"]
