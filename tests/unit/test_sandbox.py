"""The sandbox: running code, tool calls that suspend and resume, sealed snapshots across
processes, and the Sandbox object itself (threads, fair slots, names, closing).

Failures (syntax, unsupported features) and limits are tests/unit/test_sandbox_failures.py."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from lockgate.machine.errors import ErrorCode
from lockgate.machine.sandbox import (
    MONTY_VERSION,
    FailureReason,
    Finished,
    Raised,
    Returned,
    RuntimeMismatch,
    Sandbox,
    SnapshotCorrupt,
    Step,
    ToolRequest,
    seal,
    sealed_version,
    unseal,
)
from tests.support.sandboxes import FAST, NAMESPACE, P, failed, run, suspended

pytest_plugins = ["tests.support.sandboxes"]

REPO = Path(__file__).resolve().parents[2]


# --- running code -----------------------------------------------------------------------------


def test_runs_to_completion_with_output_and_logs(sandbox: Sandbox) -> None:
    step = sandbox.start(
        'print("hello")\nx = [i * i for i in range(4)]\n{"squares": x}', principal=P
    )
    assert step == Finished(output={"squares": [0, 1, 4, 9]}, logs="hello\n")


def test_a_statement_at_the_end_gives_none(sandbox: Sandbox) -> None:
    assert sandbox.start("x = 1", principal=P) == Finished(output=None, logs="")


def test_output_is_converted_to_json(sandbox: Sandbox) -> None:
    step = sandbox.start('{"t": (1, 2), "s": {3, 1}, 4: b"hi", "nan": float("nan")}', principal=P)
    assert step == Finished(
        output={"t": [1, 2], "s": [1, 3], "4": {"$bytes_base64": "aGk="}, "nan": "nan"}, logs=""
    )


def test_tool_call_suspends_with_name_and_arguments(sandbox: Sandbox) -> None:
    step = suspended(
        sandbox.start('print("before")\ntools.notes.write("k", text="v", n=[1])', principal=P)
    )
    assert step.request == ToolRequest(
        name="notes.write", args=("k",), kwargs={"text": "v", "n": [1]}
    )
    assert step.logs == "before\n"
    assert sealed_version(step.snapshot) == MONTY_VERSION
    assert "snapshot" not in repr(step)  # the live heap never lands in a log line


def test_resume_returns_the_value_to_the_code(sandbox: Sandbox) -> None:
    code = 'n = tools.notes.read(key="a")\nprint("got", n)\nn["count"] + 1'
    step = suspended(sandbox.start(code, principal=P))
    done = sandbox.resume(step.snapshot, Returned({"count": 41}), principal=P)
    assert done == Finished(output=42, logs="got {'count': 41}\n")


def test_raised_can_be_caught_by_the_code(sandbox: Sandbox) -> None:
    code = textwrap.dedent("""
        try:
            tools.mail.send(to="bob")
        except PermissionError as e:
            print("refused:", e)
        try:
            tools.mail.send(to="eve")
        except Exception as e:
            print(type(e).__name__, e)
        "went on"
    """)
    step = suspended(sandbox.start(code, principal=P))
    step = suspended(
        sandbox.resume(step.snapshot, Raised("PermissionError", "denied by Ann"), principal=P)
    )
    assert step.logs == "refused: denied by Ann\n"
    done = sandbox.resume(
        step.snapshot, Raised("RuntimeError", "E_TOOL: mailbox full"), principal=P
    )
    assert done == Finished(output="went on", logs="RuntimeError E_TOOL: mailbox full\n")


def test_uncaught_raised_fails_naming_the_error(sandbox: Sandbox) -> None:
    step = suspended(sandbox.start("x = 1\ntools.mail.send(to='bob')\nx", principal=P))
    done = failed(
        sandbox.resume(step.snapshot, Raised("ValueError", "bad address"), principal=P),
        FailureReason.RUNTIME_ERROR,
    )
    assert done.message == "ValueError: bad address (line 2)"


def test_raised_accepts_only_catchable_builtin_exceptions() -> None:
    for name in ("MyToolError", "KeyboardInterrupt", "SystemExit", "BaseException", "os.error"):
        with pytest.raises(ValueError, match="not an exception the sandbox can raise"):
            Raised(name, "x")
    assert Raised("json.JSONDecodeError", "x").exc_type == "json.JSONDecodeError"


@pytest.mark.parametrize(
    "code",
    [
        "from tools import notes\nnotes.read(key=1)",
        "import tools\ntools.notes.read(key=1)",
        "from tools.notes import read\nread(key=1)",
        "import tools.notes as n\nn.read(key=1)",
        "f = tools.notes.read\nf(key=1)",
        "def get():\n    return tools.notes.read(key=1)\nget()",
    ],
)
def test_every_import_form_reaches_the_tool(sandbox: Sandbox, code: str) -> None:
    step = suspended(sandbox.start(code, principal=P))
    assert step.request == ToolRequest("notes.read", (), {"key": 1})
    assert sandbox.resume(step.snapshot, Returned("ok"), principal=P) == Finished("ok", "")


def test_a_tool_loop_makes_one_step_per_call(sandbox: Sandbox) -> None:
    code = "[tools.notes.read(key=k) for k in ['a', 'b', 'c']]"
    step, requests = run(sandbox, code, lambda r: Returned(str(r.kwargs["key"]).upper()))
    assert step == Finished(["A", "B", "C"], "")
    assert [r.kwargs["key"] for r in requests] == ["a", "b", "c"]


def test_unknown_tool_is_a_catchable_attribute_error(sandbox: Sandbox) -> None:
    code = textwrap.dedent("""
        try:
            tools.notes.delete(key="a")
        except AttributeError as e:
            print("no:", e)
        tools.nosuch.thing()
    """)
    step = failed(sandbox.start(code, principal=P), FailureReason.RUNTIME_ERROR)
    assert step.logs == "no: module 'tools.notes' has no attribute 'delete'\n"
    assert step.message == (
        "AttributeError: module 'tools' has no attribute 'nosuch' (line 6). "
        "describe_tools(query=...) finds a tool by what it does."
    )


def test_undefined_names_are_name_errors(sandbox: Sandbox) -> None:
    code = textwrap.dedent("""
        try:
            helper(1)
        except NameError as e:
            print(e)
        missing + 1
    """)
    step = failed(sandbox.start(code, principal=P), FailureReason.RUNTIME_ERROR)
    assert step.logs == "name 'helper' is not defined\n"
    assert step.message == "NameError: name 'missing' is not defined (line 6)"


def test_files_network_and_environment_are_refused(sandbox: Sandbox) -> None:
    code = textwrap.dedent("""
        import os
        from pathlib import Path
        for attempt in (lambda: open("/etc/passwd").read(), lambda: Path("/tmp").exists(),
                        lambda: os.getenv("HOME")):
            try:
                attempt()
            except PermissionError as e:
                print(e)
    """)
    step = sandbox.start(code, principal=P)
    assert isinstance(step, Finished), step
    assert step.logs.count("not available in the sandbox") == 3


def test_sleep_returns_at_once_and_stdlib_imports_work(sandbox: Sandbox) -> None:
    code = "import time, json, math\ntime.sleep(60)\njson.dumps({'pi': round(math.pi, 2)})"
    assert sandbox.start(code, principal=P) == Finished('{"pi": 3.14}', "")
    # After a resume too (the snapshot loads with the same policy), asyncio's as well.
    code = "import time, asyncio\nx = tools.notes.read(key='a')\ntime.sleep(60)\n"
    step = suspended(sandbox.start(code + "await asyncio.sleep(60)\nx", principal=P))
    assert sandbox.resume(step.snapshot, Returned(5), principal=P) == Finished(5, "")


def test_unknown_module_is_module_not_found(sandbox: Sandbox) -> None:
    step = failed(sandbox.start("import requests", principal=P), FailureReason.RUNTIME_ERROR)
    assert step.message == "ModuleNotFoundError: No module named 'requests' (line 1)"


def test_stderr_is_in_the_logs(sandbox: Sandbox) -> None:
    step = sandbox.start('import sys\nprint("out")\nprint("err", file=sys.stderr)', principal=P)
    assert step == Finished(None, "out\nerr\n")


# --- sealed snapshots -------------------------------------------------------------------------


def test_resume_in_another_process(tmp_path: Path, sandbox: Sandbox) -> None:
    # The other process makes two steps, so the snapshot holds a tool result in a variable.
    script = textwrap.dedent("""
        import sys
        from lockgate.machine.sandbox import Returned, Sandbox, Suspended
        code = (
            'secret = tools.notes.read(key="k")\\n'
            'print("read", secret)\\n'
            'done = tools.notes.write(key="k2", text=secret.upper())\\n'
            '{"done": done, "text": secret.upper()}'
        )
        with Sandbox({"notes": ["read", "write"]}) as sb:
            step = sb.start(code, principal="bob")
            assert isinstance(step, Suspended), step
            step = sb.resume(step.snapshot, Returned("abc"), principal="bob")
            assert isinstance(step, Suspended), step
            assert step.logs == "read abc\\n", step.logs
            open(sys.argv[1], "wb").write(step.snapshot)
    """)
    path = tmp_path / "sealed.bin"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    subprocess.run(
        [sys.executable, "-c", script, str(path)], check=True, env=env, cwd=tmp_path, timeout=120
    )
    sealed = path.read_bytes()
    assert unseal(sealed)[1] == 2  # tool calls so far travel with the snapshot
    step = sandbox.resume(sealed, Returned(True), principal=P)
    assert step == Finished({"done": True, "text": "ABC"}, "")


def test_a_snapshot_can_be_resumed_again(sandbox: Sandbox) -> None:
    # The engine, not the sandbox, decides a call is answered once: the bytes replay.
    step = suspended(sandbox.start("x = tools.notes.read()\nx * 2", principal=P))
    assert sandbox.resume(step.snapshot, Returned(2), principal=P) == Finished(4, "")
    assert sandbox.resume(step.snapshot, Returned(5), principal=P) == Finished(10, "")


def test_version_mismatch(sandbox: Sandbox) -> None:
    step = suspended(sandbox.start("tools.notes.read()", principal=P))
    dump, calls = unseal(step.snapshot)
    forged = seal(dump, calls, version="0.9.9")
    assert sealed_version(forged) == "0.9.9"
    with pytest.raises(RuntimeMismatch) as info:
        sandbox.resume(forged, Returned(None), principal=P)
    err = info.value
    assert err.code is ErrorCode.RUNTIME_MISMATCH
    assert "0.9.9" in err.message and MONTY_VERSION in err.message
    assert "cannot be resumed by this server version" in err.message
    assert err.hint is not None and "Re-execute" in err.hint


def test_corrupt_snapshots(sandbox: Sandbox) -> None:
    sealed = suspended(sandbox.start("tools.notes.read()", principal=P)).snapshot
    flipped = bytearray(sealed)
    flipped[-10] ^= 0x01
    bad_digest = bytearray(sealed)
    bad_digest[len(b"LGSNAP\x00\x01") + 1 + len(MONTY_VERSION)] ^= 0xFF
    checksum, foreign = "its checksum does not match", "it is not a Lockgate snapshot"
    cases = {
        "flipped payload bit": (bytes(flipped), checksum),
        "flipped digest": (bytes(bad_digest), checksum),
        "truncated": (sealed[:-1], checksum),
        "header only": (sealed[:20], checksum),
        "no version": (sealed[: len(b"LGSNAP\x00\x01")], "its header is unreadable"),
        "raw monty dump": (unseal(sealed)[0], foreign),
        "empty": (b"", foreign),
    }
    for name, (blob, detail) in cases.items():
        with pytest.raises(SnapshotCorrupt) as info:
            sandbox.resume(blob, Returned(None), principal=P)
        assert info.value.code is ErrorCode.SNAPSHOT_CORRUPT, name
        assert info.value.message == (
            f"the stored snapshot of this paused execution is damaged ({detail}); it cannot "
            "be resumed"
        ), name
    with pytest.raises(SnapshotCorrupt):
        sealed_version(b"not a snapshot")
    # A well-sealed dump that Monty refuses is corrupt too, not a crash.
    with pytest.raises(SnapshotCorrupt, match="could not load"):
        sandbox.resume(seal(b"MONTY\x00garbage", 1), Returned(None), principal=P)


def test_a_tool_dropped_from_the_namespace_is_an_attribute_error(
    sandbox: Sandbox, make: Callable[..., Sandbox]
) -> None:
    step = suspended(sandbox.start("tools.notes.read()\ntools.notes.write()", principal=P))
    narrower = make({"notes": ["read"]})
    done = failed(
        narrower.resume(step.snapshot, Returned(None), principal=P), FailureReason.RUNTIME_ERROR
    )
    assert done.message.startswith(
        "AttributeError: module 'tools.notes' has no attribute 'write' (line 2)."
    )


# --- the Sandbox object -----------------------------------------------------------------------


def test_steps_run_concurrently_from_threads(sandbox: Sandbox) -> None:
    results: dict[int, Step] = {}

    def job(n: int) -> None:
        code = f"a = tools.notes.read(n={n})\nb = tools.notes.read(n={n})\na + b"
        results[n] = run(sandbox, code, lambda r: Returned(r.kwargs["n"]))[0]

    threads = [threading.Thread(target=job, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {n: Finished(2 * n, "") for n in range(6)}
    assert sandbox.slots.held(P) == 0 and sandbox.slots.waiting() == []


def test_steps_take_a_fair_slot_for_their_principal() -> None:
    sb = Sandbox(NAMESPACE, FAST, max_processes=2, max_per_principal=1)
    try:
        assert (sb.slots.capacity, sb.slots.per_principal) == (2, 1)
        # Every kind of step gives its slot back: finished, suspended, failed, refused.
        step = suspended(sb.start("tools.notes.read()", principal="alice"))
        assert sb.resume(step.snapshot, Returned(1), principal="alice") == Finished(1, "")
        failed(sb.start("def f(:", principal="alice"), FailureReason.SYNTAX_ERROR)
        with pytest.raises(SnapshotCorrupt):
            sb.resume(b"", Returned(None), principal="alice")
        assert sb.slots.held("alice") == 0
    finally:
        sb.close()


def test_namespace_names_are_checked() -> None:
    for bad in ({"no-dash": ["x"]}, {"notes": ["class"]}, {"notes": ["_hidden"]}):
        with pytest.raises(ValueError, match="cannot be a tool source or tool name"):
            Sandbox(bad)


def test_closed_sandbox_refuses_steps() -> None:
    sb = Sandbox(NAMESPACE, FAST, max_processes=1)
    sb.close()
    sb.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        sb.start("1", principal=P)
    assert sb.slots.held(P) == 0
