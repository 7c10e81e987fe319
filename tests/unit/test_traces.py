"""`spec.traces.check_trace`: a persisted trace replayed through the model, fences included.

The real traces are checked after every test (tests/conftest.py) and every simulated run;
these pin, on hand-written traces, that each kind of disagreement is named.
"""

from __future__ import annotations

from lockgate.spec import COMPOSITIONS, MACHINES
from lockgate.spec.traces import LoggedStep, check_trace

EX, CALL = "e1", "e1:1"
PARENTS = {CALL: EX}


def step(
    n: int,
    machine: str,
    record: str,
    event: str,
    source: str,
    dest: str,
    version: int,
    txn: str,
    fence: str | None = None,
) -> LoggedStep:
    return LoggedStep(n, machine, record, event, source, dest, version, txn, fence)


def run_to_dispatch(fence: str | None = "execution:e1:2") -> list[LoggedStep]:
    """start, checkpoint (the call is inserted), auto_approve and dispatch under a fence."""
    return [
        step(1, "execution", EX, "start", "pending", "running", 1, "t1"),
        step(2, "execution", EX, "checkpoint", "running", "running", 2, "t2"),
        step(3, "tool_call", CALL, "auto_approve", "requested", "approved", 1, "t3", fence),
        step(4, "tool_call", CALL, "dispatch", "approved", "dispatched", 2, "t4", fence),
    ]


def problems(steps: list[LoggedStep]) -> list[str]:
    return check_trace(steps, PARENTS, MACHINES, COMPOSITIONS)


def test_a_run_as_the_engine_writes_it_agrees_with_the_model() -> None:
    assert problems(run_to_dispatch()) == []


def test_an_undeclared_edge_and_a_wrong_source_are_named() -> None:
    steps = run_to_dispatch()
    steps[3] = step(4, "tool_call", CALL, "dispatch", "requested", "dispatched", 2, "t4")
    found = problems(steps)
    assert any("not an edge of the spec" in p for p in found), found
    assert any("the record was 'approved'" in p for p in found), found


def test_a_fenced_step_without_its_fence_is_named() -> None:
    found = problems(run_to_dispatch(fence=None))
    assert any("dispatch" in p and "fence None" in p for p in found), found


def test_a_stale_owner_s_step_names_an_older_version_and_is_named() -> None:
    """Recovery requeued the execution (version 3) and a new owner started it (version 4);
    the stalled owner's dispatch carries the version it had read before (2)."""
    steps = [
        *run_to_dispatch()[:3],
        step(4, "execution", EX, "requeue", "running", "pending", 3, "t4"),
        step(5, "execution", EX, "start", "pending", "running", 4, "t5"),
        step(6, "tool_call", CALL, "dispatch", "approved", "dispatched", 2, "t6", "execution:e1:2"),
    ]
    found = problems(steps)
    assert any("log row 6" in p and "execution:e1:4" in p for p in found), found


def test_a_call_moving_while_its_execution_does_not_run_is_named() -> None:
    steps = [
        *run_to_dispatch()[:3],
        step(4, "execution", EX, "requeue", "running", "pending", 3, "t4"),
        step(5, "tool_call", CALL, "dispatch", "approved", "dispatched", 2, "t5", "execution:e1:3"),
    ]
    found = problems(steps)
    assert any("its execution is 'pending'" in p for p in found), found


def test_a_joint_step_committed_alone_is_named() -> None:
    """A pause is only ever committed with its call's request for approval."""
    steps = [
        step(1, "execution", EX, "start", "pending", "running", 1, "t1"),
        step(2, "execution", EX, "checkpoint", "running", "running", 2, "t2"),
        step(3, "tool_call", CALL, "request_approval", "requested", "awaiting_approval", 1, "t3"),
        step(4, "execution", EX, "pause", "running", "waiting_for_interaction", 3, "t4"),
    ]
    found = problems(steps)
    assert any("pause" in p and "without its partner" in p for p in found), found
    together = [
        *steps[:2],
        step(3, "tool_call", CALL, "request_approval", "requested", "awaiting_approval", 1, "t3"),
        step(4, "execution", EX, "pause", "running", "waiting_for_interaction", 3, "t3"),
    ]
    assert problems(together) == []


def test_a_version_that_skips_is_named() -> None:
    steps = run_to_dispatch()
    steps[1] = step(2, "execution", EX, "checkpoint", "running", "running", 5, "t2")
    found = problems(steps)
    assert any("version 5 after 1" in p for p in found), found


def approved_then_requeued(fence: str | None) -> list[LoggedStep]:
    """The owner approved its call and died; recovery requeues the execution."""
    return [
        *run_to_dispatch()[:3],
        step(4, "execution", EX, "requeue", "running", "pending", 3, "t4", fence),
    ]


def test_a_recovery_decided_on_the_call_it_read_commits_fenced_on_that_call() -> None:
    assert problems(approved_then_requeued("tool_call:e1:1:1")) == []
    # Or moving the call in the same transaction (its own version check guards it).
    together = [
        *run_to_dispatch(),
        step(5, "tool_call", CALL, "mark_in_doubt", "dispatched", "in_doubt", 3, "t5"),
        step(6, "execution", EX, "interrupt", "running", "interrupted", 3, "t5"),
    ]
    assert problems(together) == []


def test_a_recovery_commit_not_fenced_on_the_latest_call_is_named() -> None:
    """The window the fence closes: a stalled owner could dispatch the call between
    recovery's read and this commit, and nothing would refuse it."""
    for fence in (None, "execution:e1:2", "tool_call:e1:1:0"):
        found = problems(approved_then_requeued(fence))
        assert any(
            "requeue" in p and "not its latest tool_call" in p and "tool_call:e1:1:1" in p
            for p in found
        ), (fence, found)


def test_a_carried_step_committed_without_a_step_of_its_execution_is_named() -> None:
    """A call made at once is journaled only with its execution's next durable step."""
    start = step(1, "execution", EX, "start", "pending", "running", 1, "t1")
    made = ("tool_call", CALL, "succeed_at_least_once", "requested", "succeeded", 1)
    found = problems([start, step(2, *made, "t2")])
    assert any("carried, but committed without a step of its execution" in p for p in found)
    ended = step(3, "execution", EX, "complete", "running", "completed", 2, "t2")
    assert problems([start, step(2, *made, "t2"), ended]) == []
