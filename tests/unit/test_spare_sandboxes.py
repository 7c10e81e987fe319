"""The simulator hands a dead incarnation's sandbox to the next one only when it is idle."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from lockgate.machine.sandbox import Finished, Returned, Sandbox
from lockgate.simulation.world import SpareSandboxes
from tests.support.sandboxes import FAST, NAMESPACE, P, run


def output(sandbox: Sandbox, code: str) -> object:
    """What `code` ends with, each tool call answered with its tool's name."""
    step, _ = run(sandbox, code, lambda request: Returned(request.name))
    assert isinstance(step, Finished), step
    return step.output


@pytest.fixture(name="spares")
def spares_fixture() -> Iterator[SpareSandboxes]:
    spares = SpareSandboxes()
    yield spares
    spares.close()


def test_an_idle_sandbox_is_handed_out_again_and_runs_code(spares: SpareSandboxes) -> None:
    first = spares.take(NAMESPACE, FAST, max_processes=1)
    assert output(first, "x = 20 + 1\nx") == 21
    spares.give_back(first)
    again = spares.take(NAMESPACE, FAST, max_processes=1)
    assert again is first
    assert output(again, "tools.notes.read(key='k')") == "notes.read"


def test_a_sandbox_made_otherwise_is_not_handed_out(spares: SpareSandboxes) -> None:
    first = spares.take(NAMESPACE, FAST, max_processes=1)
    spares.give_back(first)
    other = spares.take(NAMESPACE, FAST, max_processes=2)
    assert other is not first
    other.close()
    assert spares.take({"mail": ["send"]}, FAST, max_processes=1) is not first


def test_a_stopped_sandbox_is_closed_not_kept(spares: SpareSandboxes) -> None:
    first = spares.take(NAMESPACE, FAST, max_processes=1)
    first.stop()  # a draining incarnation's
    spares.give_back(first)
    assert not first.idle
    fresh = spares.take(NAMESPACE, FAST, max_processes=1)
    assert fresh is not first
    assert output(fresh, "1") == 1


def test_a_sandbox_with_a_slot_held_is_closed_not_kept(spares: SpareSandboxes) -> None:
    first: Sandbox = spares.take(NAMESPACE, FAST, max_processes=1)
    with first.slots.acquire(P):  # a step of the dead incarnation, still holding its slot
        spares.give_back(first)
    assert spares.take(NAMESPACE, FAST, max_processes=1) is not first
