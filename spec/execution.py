"""The execution lifecycle: one run of agent code, from submission to its final word."""

from __future__ import annotations

from enum import StrEnum

from lockgate.spec.model import (
    MachineSpec,
    Otherwise,
    StateSpec,
    TransitionKind,
    TransitionSpec,
    durable_wait,
    recover_by,
)


class ExecutionStatus(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    WAITING_FOR_INTERACTION = "waiting_for_interaction"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"
    INTERRUPTED = "interrupted"


S = ExecutionStatus

EXECUTION = MachineSpec(
    name="execution",
    title="Execution",
    description=(
        "One run of agent code in the sandbox. It pauses (durably: snapshot, pending call and "
        "deadline in one transaction) when a tool call needs a person's approval, and goes on "
        "from that snapshot in any process once the decision arrives."
    ),
    status=ExecutionStatus,
    states=(
        StateSpec(
            name=S.PENDING,
            description="Stored and waiting for an instance to claim it (new, requeued "
            "after a crash, or handed back by a draining owner, to go on from its last "
            "checkpoint).",
            initial=True,
            on_crash=durable_wait("Nothing runs it yet: any live instance claims it."),
        ),
        StateSpec(
            name=S.RUNNING,
            description="An instance runs the code in the sandbox (it owns the record).",
            owned=True,
            on_crash=recover_by(
                "requeue",
                "interrupt",
                why="The owner died mid-run. If every call it made is settled or safe to "
                "retry, it is requeued to go on from its last checkpoint; otherwise it ends "
                "interrupted, naming what ran and the call in doubt.",
            ),
        ),
        StateSpec(
            name=S.WAITING_FOR_INTERACTION,
            description="Paused on a tool call that needs a person's decision, or whose tool "
            "asked its user for values; the snapshot and the pending call are stored, no "
            "process holds it.",
            on_crash=durable_wait("Everything needed to go on is in the row."),
        ),
        StateSpec(name=S.COMPLETED, description="The code returned a result.", terminal=True),
        StateSpec(
            name=S.FAILED,
            description="The code raised, hit a limit, or the sandbox crashed.",
            terminal=True,
        ),
        StateSpec(name=S.CANCELLED, description="Cancelled by its principal.", terminal=True),
        StateSpec(
            name=S.EXPIRED,
            description="No decision (or answer) arrived before the deadline.",
            terminal=True,
        ),
        StateSpec(
            name=S.INTERRUPTED,
            description="Cut off by a crash where going on could repeat an effect; the record "
            "names the calls that ran and the call in doubt.",
            terminal=True,
        ),
    ),
    transitions=(
        TransitionSpec(
            event="start",
            source=(S.PENDING,),
            dest=S.RUNNING,
            effects=("claim_owner",),
            description="An instance claims the execution and runs it (from its last "
            "checkpoint, if it has one).",
        ),
        TransitionSpec(
            event="checkpoint",
            source=(S.RUNNING,),
            dest=S.RUNNING,
            effects=("store_snapshot",),
            description="Store a snapshot at an external call, so a crash goes on from here.",
        ),
        TransitionSpec(
            event="pause",
            source=(S.RUNNING,),
            dest=S.WAITING_FOR_INTERACTION,
            effects=("store_snapshot", "set_deadline", "release_owner"),
            description="A call needs approval, or its tool asked for values: snapshot, "
            "pending call and deadline are stored in the same transaction as the tool call's "
            "request_approval (or ask).",
        ),
        TransitionSpec(
            event="resume",
            source=(S.WAITING_FOR_INTERACTION,),
            dest=S.RUNNING,
            unless=("deadline_passed",),
            effects=("claim_owner",),
            description="A decision (or the last answer) arrived in time; the claiming "
            "instance loads the snapshot and goes on (the tool call is approved, declined or "
            "answered in the same transaction).",
        ),
        TransitionSpec(
            event="complete",
            source=(S.RUNNING,),
            dest=S.COMPLETED,
            effects=("store_outcome", "release_owner"),
            description="The code returned; result and logs are stored.",
        ),
        TransitionSpec(
            event="fail",
            source=(S.RUNNING,),
            dest=S.FAILED,
            effects=("store_outcome", "release_owner"),
            description="The code raised, hit a limit, or the sandbox worker crashed.",
        ),
        TransitionSpec(
            event="expire",
            source=(S.WAITING_FOR_INTERACTION,),
            dest=S.EXPIRED,
            conditions=("deadline_passed",),
            description="The approval deadline passed (found on access or by the sweep).",
        ),
        TransitionSpec(
            event="cancel",
            source=(S.PENDING, S.WAITING_FOR_INTERACTION),
            dest=S.CANCELLED,
            description="Its principal cancelled it while it was queued or paused (a running "
            "execution is not interrupted mid-step; it can be cancelled at its next pause).",
        ),
        # A live owner that drains (SIGTERM) hands its running work back rather than waiting
        # for it: agent code may run for minutes, the platform kills the process ~30 s after
        # SIGTERM. It is not `requeue`: that is recovery's verdict on a dead owner's work, taken
        # by another process (and refused by the conservative policy); here the owner itself
        # knows no call is in flight (the composition allows it only with the current call
        # settled or not yet sent), so going on from the checkpoint repeats no effect, under
        # either recovery policy.
        TransitionSpec(
            event="hand_back",
            source=(S.RUNNING,),
            dest=S.PENDING,
            effects=("release_owner",),
            description="The owner is draining: back to the queue to go on from its last "
            "checkpoint (its code since then runs again; no call was in flight).",
        ),
        TransitionSpec(
            event="requeue",
            source=(S.RUNNING,),
            dest=S.PENDING,
            kind=TransitionKind.RECOVERY,
            unless=("must_interrupt",),
            effects=("release_owner",),
            description="Recovery: the owner died and going on is safe; back to the queue to "
            "resume from the last checkpoint.",
        ),
        TransitionSpec(
            event="interrupt",
            source=(S.RUNNING,),
            dest=S.INTERRUPTED,
            kind=TransitionKind.RECOVERY,
            conditions=("must_interrupt",),
            effects=("record_what_ran", "release_owner"),
            description="Recovery: the owner died and going on could repeat an effect (a "
            "non-idempotent call in doubt, or the operator chose the conservative policy).",
        ),
    ),
)

# Keep `Otherwise` importable from here for readers following the spec file alone.
__all__ = ["EXECUTION", "ExecutionStatus", "Otherwise"]
