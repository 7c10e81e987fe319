"""The sandboxes the sandbox tests run code in, and the readers of their steps.

`sandbox` is one Sandbox per test module (`NAMESPACE`, the `FAST` limits, two processes);
`make` builds a Sandbox with its own limits, closed after the test. Every step runs for the
principal `P`; `suspended` and `failed` check what a step is, and `run` drives code to its
end, answering every tool call.

A pytest plugin: test modules load the fixtures with
`pytest_plugins = ["tests.support.sandboxes"]`, and import the helpers from here before
pytest registers the plugin, hence PYTEST_DONT_REWRITE (as in `tests.support.servers`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from lockgate.machine.sandbox import (
    Failed,
    FailureReason,
    Sandbox,
    SandboxLimits,
    Step,
    Suspended,
    ToolOutcome,
    ToolRequest,
)

NAMESPACE = {"notes": ["read", "write"], "mail": ["send"]}
FAST = SandboxLimits(max_duration_secs=5, worker_timeout_secs=30)
#: The principal every step here runs for (the engine passes the execution's).
P = "alice"


@pytest.fixture(name="sandbox", scope="module")
def sandbox_fixture() -> Iterator[Sandbox]:
    with Sandbox(NAMESPACE, FAST, max_processes=2) as sb:
        yield sb


@pytest.fixture(name="make")
def make_fixture() -> Iterator[Callable[..., Sandbox]]:
    """A Sandbox with its own limits, closed after the test."""
    made: list[Sandbox] = []

    def factory(namespace: dict[str, list[str]] | None = None, **limits: object) -> Sandbox:
        sb = Sandbox(namespace or NAMESPACE, SandboxLimits(**limits), max_processes=1)  # type: ignore[arg-type]
        made.append(sb)
        return sb

    yield factory
    for sb in made:
        sb.close()


def suspended(step: Step) -> Suspended:
    assert isinstance(step, Suspended), step
    return step


def failed(step: Step, reason: FailureReason) -> Failed:
    assert isinstance(step, Failed), step
    assert step.reason is reason, step
    return step


def run(
    sb: Sandbox, code: str, answer: Callable[[ToolRequest], ToolOutcome]
) -> tuple[Step, list[ToolRequest]]:
    """Drive `code` to its end, answering every tool call with `answer`."""
    step, requests = sb.start(code, principal=P), []
    while isinstance(step, Suspended):
        requests.append(step.request)
        step = sb.resume(step.snapshot, answer(step.request), principal=P)
    return step, requests
