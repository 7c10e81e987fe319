from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from pydantic import JsonValue

from lockgate.machine.policy import PolicyDecision
from lockgate.machine.tools import NotesSource, ToolContext, ToolFailed, ToolRegistry
from lockgate.machine.tools.notes import EFFECTS_FILE, NOTES_FILE

TOKEN = "notes-token-0123456789"


def context(key: str = "ex:1", token: str | None = TOKEN) -> ToolContext:
    secrets = {} if token is None else {"notes_token": token}
    return ToolContext(idempotency_key=key, secrets=secrets, principal_id="alice")


def call(
    source: NotesSource, name: str, ctx: ToolContext | None = None, **arguments: JsonValue
) -> JsonValue:
    registry = ToolRegistry()
    registry.register(source)
    checked = registry.validate_arguments(f"notes.{name}", dict(arguments), [])
    return registry.get(f"notes.{name}").call(checked, ctx or context())


@pytest.fixture(params=["memory", "disk"])
def notes(request: pytest.FixtureRequest, tmp_path: Path) -> NotesSource:
    return NotesSource(None if request.param == "memory" else tmp_path / "notes")


def test_specs() -> None:
    specs = {tool.spec.name: tool.spec for tool in NotesSource().tools()}
    assert set(specs) == {"read", "list", "write", "delete"}
    for name in ("read", "list"):
        assert specs[name].idempotent
        assert specs[name].default_policy is PolicyDecision.APPROVE
    for name in ("write", "delete"):
        assert not specs[name].idempotent
        assert specs[name].default_policy is PolicyDecision.REQUIRE_APPROVAL
    # The demo writes local files: it needs no secret, so a first run needs no set-up.
    assert all(spec.secrets == () for spec in specs.values())
    credentialed = NotesSource(expected_token=TOKEN).tools()
    assert all(tool.spec.secrets == ("notes_token",) for tool in credentialed)


def test_write_read_list_delete(notes: NotesSource) -> None:
    assert call(notes, "list") == []
    assert call(notes, "write", key="b", text="two") == {"key": "b", "written": True}
    assert call(notes, "write", key="a", text="one") == {"key": "a", "written": True}
    assert call(notes, "write", key="a", text="uno") == {"key": "a", "written": True}
    assert call(notes, "read", key="a") == {"key": "a", "text": "uno"}
    assert call(notes, "list") == ["a", "b"]
    assert call(notes, "delete", key="a") == {"key": "a", "deleted": True}
    assert call(notes, "delete", key="a") == {"key": "a", "deleted": False}
    assert call(notes, "list") == ["b"]


def test_reading_a_missing_note_fails(notes: NotesSource) -> None:
    with pytest.raises(ToolFailed, match="there is no note 'nope'"):
        call(notes, "read", key="nope")


def test_effect_log_counts_every_dispatch(notes: NotesSource) -> None:
    call(notes, "write", context("ex:1"), key="a", text="x")
    call(notes, "write", context("ex:1"), key="a", text="x")  # a re-dispatch, not deduplicated
    call(notes, "read", context("ex:2"), key="a")
    call(notes, "list", context("ex:3"))
    call(notes, "delete", context("ex:4"), key="zzz")
    effects = notes.effects()
    assert [(e["tool"], e["read"], e["key"], e["idempotency_key"]) for e in effects] == [
        ("notes.write", False, "a", "ex:1"),
        ("notes.write", False, "a", "ex:1"),
        ("notes.read", True, "a", "ex:2"),
        ("notes.list", True, None, "ex:3"),
        ("notes.delete", False, "zzz", "ex:4"),
    ]
    assert all(e["principal_id"] == "alice" for e in effects)
    assert len([e for e in effects if not e["read"]]) == 3


def test_failed_read_is_still_logged(notes: NotesSource) -> None:
    with pytest.raises(ToolFailed):
        call(notes, "read", key="missing")
    assert [e["tool"] for e in notes.effects()] == ["notes.read"]


def test_notes_persist_across_instances(tmp_path: Path) -> None:
    # A notes folder the operator named but never made is made, its parents too.
    first = NotesSource(tmp_path / "data" / "notes")
    call(first, "write", key="k", text="kept")
    second = NotesSource(tmp_path / "data" / "notes")
    assert call(second, "read", key="k") == {"key": "k", "text": "kept"}
    call(second, "write", key="j", text="also")
    assert call(first, "list") == ["j", "k"]  # no stale cache in the first instance
    assert len(first.effects()) == len(second.effects()) == 4


def test_files_on_disk_are_whole_and_temporary_files_are_gone(tmp_path: Path) -> None:
    notes = NotesSource(tmp_path)
    for i in range(5):
        call(notes, "write", key=f"k{i}", text=str(i))
    assert json.loads((tmp_path / NOTES_FILE).read_text())["k4"] == "4"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")) == []


def test_a_torn_last_log_line_is_skipped(tmp_path: Path) -> None:
    notes = NotesSource(tmp_path)
    call(notes, "write", key="a", text="x")
    with open(tmp_path / EFFECTS_FILE, "a") as log:
        log.write('{"tool": "notes.wri')  # what a SIGKILL mid-append can leave
    assert len(notes.effects()) == 1
    assert NotesSource(tmp_path / "empty").effects() == []


def test_effects_from_another_process_are_counted(tmp_path: Path) -> None:
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "from lockgate.machine.tools import NotesSource, ToolContext\n"
        "tool = {t.spec.name: t for t in NotesSource(Path(sys.argv[1])).tools()}['write']\n"
        "ctx = ToolContext(idempotency_key='child:1', secrets={'notes_token': 't0k3n'},"
        " principal_id='p')\n"
        "tool.call({'key': 'child', 'text': 'hi'}, ctx)\n"
    )
    subprocess.run([sys.executable, "-c", script, str(tmp_path)], check=True, timeout=60)
    notes = NotesSource(tmp_path)
    assert call(notes, "read", key="child") == {"key": "child", "text": "hi"}
    assert [e["idempotency_key"] for e in notes.effects() if not e["read"]] == ["child:1"]


def test_concurrent_writes_from_threads(notes: NotesSource) -> None:
    start = threading.Event()
    errors: list[BaseException] = []

    def writer(n: int) -> None:
        start.wait()
        try:
            for i in range(20):
                call(notes, "write", context(f"t{n}:{i}"), key=f"{n}-{i}", text="x")
        except BaseException as exc:  # surfaced below, not lost in the thread
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    start.set()
    for thread in threads:
        thread.join()
    assert errors == []
    listed = call(notes, "list")
    assert isinstance(listed, list) and len(listed) == 120
    assert len(notes.effects()) == 121  # 120 writes and the list


ARGUMENTS: dict[str, dict[str, JsonValue]] = {
    "read": {"key": "a"},
    "list": {},
    "write": {"key": "a", "text": "x"},
    "delete": {"key": "a"},
}


@pytest.mark.parametrize("name", ["read", "list", "write", "delete"])
def test_with_an_expected_token_every_tool_needs_it(tmp_path: Path, name: str) -> None:
    notes = NotesSource(tmp_path, expected_token=TOKEN)
    arguments = ARGUMENTS[name]
    with pytest.raises(ToolFailed, match="notes token missing"):
        call(notes, name, context(token=None), **arguments)
    with pytest.raises(ToolFailed, match="notes token missing"):
        call(notes, name, context(token=""), **arguments)
    assert notes.effects() == []  # refused before anything ran


@pytest.mark.parametrize("name", ["list", "write", "delete"])
def test_the_demo_tools_run_without_a_token(notes: NotesSource, name: str) -> None:
    call(notes, name, context(token=None), **ARGUMENTS[name])
    assert [entry["tool"] for entry in notes.effects()] == [f"notes.{name}"]


def test_a_wrong_token_is_rejected_without_echoing_either(tmp_path: Path) -> None:
    notes = NotesSource(tmp_path, expected_token=TOKEN)
    wrong = "wrong-token-987654321"
    with pytest.raises(ToolFailed) as caught:
        call(notes, "write", context(token=wrong), key="a", text="x")
    assert caught.value.message == "notes token rejected"
    assert wrong not in str(caught.value) and TOKEN not in str(caught.value)
    assert call(notes, "write", context(token=TOKEN), key="a", text="x") == {
        "key": "a",
        "written": True,
    }


def test_the_token_never_reaches_storage(tmp_path: Path) -> None:
    notes = NotesSource(tmp_path, expected_token=TOKEN)
    call(notes, "write", key="a", text="x")
    call(notes, "read", key="a")
    for path in tmp_path.iterdir():
        assert TOKEN not in path.read_text(), path.name
    assert TOKEN not in repr(notes.tools())


def test_direct_calls_with_bad_arguments_fail_cleanly() -> None:
    tool = {t.spec.name: t for t in NotesSource().tools()}["write"]
    with pytest.raises(ToolFailed, match="argument 'text' must be a string"):
        tool.call({"key": "a", "text": 3}, context())
