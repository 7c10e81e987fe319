"""The sandbox's failures and limits: syntax errors and unsupported syntax (awaiting a tool
included), the time, recursion, memory and call limits, a worker that stops responding, and
capped output and logs.

Running code, sealed snapshots and the Sandbox object are tests/unit/test_sandbox.py."""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from typing import cast

import pytest
from pydantic import JsonValue

from lockgate.machine.sandbox import FailureReason, Finished, Returned, Sandbox
from tests.support.sandboxes import P, failed, run, suspended

pytest_plugins = ["tests.support.sandboxes"]


# --- failures ---------------------------------------------------------------------------------


def test_syntax_error(sandbox: Sandbox) -> None:
    step = failed(
        sandbox.start("x = 1\ndef f(:\n    pass", principal=P), FailureReason.SYNTAX_ERROR
    )
    assert step.message.startswith("SyntaxError: ")
    assert step.message.endswith("(line 2)")


@pytest.mark.parametrize(
    ("code", "feature"),
    [
        ("class A(Exception):\n    pass", "class inheritance and metaclasses (line 1)"),
        ("def g():\n    yield 1", "yield expressions (line 2)"),
        ("x = 1\ndel x", "the 'del' statement (line 2)"),
    ],
)
def test_unsupported_syntax(sandbox: Sandbox, code: str, feature: str) -> None:
    step = failed(sandbox.start(code, principal=P), FailureReason.UNSUPPORTED)
    assert step.message == (
        f"this Python feature is not supported in the sandbox: {feature}; rewrite the code "
        "without it"
    )


def test_a_code_raised_not_implemented_error_is_a_runtime_error(sandbox: Sandbox) -> None:
    step = failed(
        sandbox.start("raise NotImplementedError('todo')", principal=P), FailureReason.RUNTIME_ERROR
    )
    assert step.message == "NotImplementedError: todo (line 1)"


@pytest.mark.parametrize("text", ["time limit exceeded", "memory limit exceeded"])
def test_the_code_s_own_error_that_names_a_limit_is_its_own_error(
    sandbox: Sandbox, text: str
) -> None:
    step = failed(
        sandbox.start(f"raise ValueError({text!r})", principal=P), FailureReason.RUNTIME_ERROR
    )
    assert step.message == f"ValueError: {text} (line 1)"


def test_a_tool_result_the_sandbox_cannot_hold_fails_the_code_with_the_sandbox_s_words(
    sandbox: Sandbox,
) -> None:
    """A tool (an operator's own Python, say) may break its type and answer with an object:
    the code fails with the sandbox's own explanation, not a crash of the server."""
    step = suspended(sandbox.start("tools.notes.read()", principal=P))
    done = failed(
        sandbox.resume(step.snapshot, Returned(cast(JsonValue, object())), principal=P),
        FailureReason.RUNTIME_ERROR,
    )
    assert done.message == (
        "TypeError: Cannot convert builtins.object to Monty value — wrap class instances in "
        "pydantic_monty.ClassInstance(...)"
    )


def test_awaiting_a_tool_stops_before_the_tool_runs(sandbox: Sandbox) -> None:
    step = failed(sandbox.start("await tools.notes.read()", principal=P), FailureReason.UNSUPPORTED)
    assert "without `await`" in step.message
    # A plain call inside async code is fine.
    code = "async def main():\n    return tools.notes.read()\nawait main()"
    step2 = suspended(sandbox.start(code, principal=P))
    assert sandbox.resume(step2.snapshot, Returned(1), principal=P) == Finished(1, "")


def test_time_limit(make: Callable[..., Sandbox]) -> None:
    sb = make(max_duration_secs=0.5)
    step = failed(
        sb.start('print("spinning")\nwhile True:\n    pass', principal=P), FailureReason.TIME_LIMIT
    )
    assert step.message == (
        "the code ran longer than its 0.5 s limit (time spent waiting for tools does not count)"
    )
    assert step.logs == "spinning\n"


def test_time_limit_counts_the_whole_execution(make: Callable[..., Sandbox]) -> None:
    sb = make(max_duration_secs=0.5, max_calls=5000)
    # About 2.5 ms of work between calls here (Monty runs about 20 million of these loop
    # steps a second), 10 s in all: the 0.5 s limit falls after about 200 calls, and after
    # several calls still on a machine (or a moment of contention) 100x slower, or 10x
    # faster. Fixed larger steps failed both ways: a fast moment finished the whole under
    # the limit, a contended one reached it before the second call.
    code = textwrap.dedent("""
        for i in range(4000):
            t = 0
            for j in range(50_000):
                t += j
            tools.notes.write(i=i)
    """)
    step, requests = run(sb, code, lambda r: Returned(None))
    failed(step, FailureReason.TIME_LIMIT)
    assert 1 < len(requests) < 4000


def test_recursion_limit(make: Callable[..., Sandbox]) -> None:
    sb = make(max_recursion_depth=50)
    step = failed(
        sb.start("def f(n):\n    return f(n + 1)\nf(0)", principal=P), FailureReason.RECURSION_LIMIT
    )
    assert "50" in step.message


def test_memory_limit(make: Callable[..., Sandbox]) -> None:
    sb = make(max_memory_bytes=10_000_000)
    step = failed(sb.start("x = [0] * 50_000_000", principal=P), FailureReason.MEMORY_LIMIT)
    assert step.message == "the code used more than its 9.53674 MiB of memory"


def test_call_limit_across_steps(make: Callable[..., Sandbox]) -> None:
    sb = make(max_calls=3)
    step, requests = run(
        sb, "for i in range(10):\n    tools.notes.write(i=i)", lambda r: Returned(None)
    )
    assert len(requests) == 3
    assert failed(step, FailureReason.CALL_LIMIT).message.startswith(
        "the code made more than 3 tool calls"
    )


def test_call_limit_within_a_step(make: Callable[..., Sandbox]) -> None:
    sb = make(max_calls=3)
    code = "for i in range(10):\n    try:\n        nothing()\n    except NameError:\n        pass"
    assert failed(sb.start(code, principal=P), FailureReason.CALL_LIMIT).message == (
        "the code made more than 3 calls out of the sandbox in one step (tool calls, imports "
        "of tools, calls to undefined names)"
    )


def test_crashed_worker_fails_the_step_and_the_sandbox_goes_on(
    make: Callable[..., Sandbox],
) -> None:
    sb = make(max_duration_secs=30, worker_timeout_secs=0.5)
    step = failed(sb.start("while True:\n    pass", principal=P), FailureReason.SANDBOX_CRASHED)
    assert "stopped responding" in step.message
    assert sb.start("1 + 1", principal=P) == Finished(2, "")


def test_output_and_logs_are_capped(make: Callable[..., Sandbox]) -> None:
    sb = make(max_output_bytes=300, max_log_chars=20)
    step = sb.start('for i in range(10):\n    print("line", i)\n"x" * 10_000', principal=P)
    assert isinstance(step, Finished), step
    assert isinstance(step.output, dict)
    assert step.output["truncated"] is True
    assert step.output["original_bytes"] == 10_002
    assert step.logs == "line 0\nline 1\nline 2\n… [truncated: 50 more characters]"
