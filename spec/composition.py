"""How an execution and its current tool call move together.

Some steps change both records in ONE transaction (a pause stores the snapshot and puts the
call up for approval at once; a call is checkpointed, approved and sent in one), and a call
that may be made again is journaled with its execution's next durable step (`carried`). The
model checker explores the product of the two machines with these joint steps and the
`requires` constraints, and crashes it at every point (a carried step's crash points are its
own: a crash before the commit it rides with loses it, as one before its own commit would).
"""

from __future__ import annotations

from lockgate.spec.execution import ExecutionStatus as E
from lockgate.spec.model import Composition, JointStep
from lockgate.spec.tool_call import ToolCallStatus as C

_CALL_SETTLED = (C.SUCCEEDED, C.FAILED, C.DECLINED, C.BLOCKED, C.EXPIRED, C.WITHDRAWN, C.IN_DOUBT)

EXECUTION_WITH_TOOL_CALL = Composition(
    name="execution_with_tool_call",
    machines=("execution", "tool_call"),
    description=(
        "An execution and the tool call it is currently making. A settled call lets the "
        "execution finish or make its next call (a new journal row with the next sequence)."
    ),
    joint_steps=(
        JointStep(
            name="call_sent",
            steps=(
                ("execution", "checkpoint"),
                ("tool_call", "auto_approve"),
                ("tool_call", "dispatch"),
            ),
            description="A call the policy approves that is journaled before it runs (it "
            "must not run twice, or retries are off): the checkpoint, the call's row, its "
            "approval and its intent commit together; then the tool runs.",
        ),
        JointStep(
            name="call_blocked",
            steps=(("execution", "checkpoint"), ("tool_call", "block")),
            description="The policy forbids the call: the checkpoint, the call's row and its "
            "refusal commit together.",
        ),
        JointStep(
            name="pause",
            steps=(
                ("execution", "checkpoint"),
                ("tool_call", "request_approval"),
                ("execution", "pause"),
            ),
            description="The call needs approval: the checkpoint, the call's row and its "
            "request for approval commit with the execution's pause.",
        ),
        JointStep(
            name="resume_accept",
            steps=(("tool_call", "approve"), ("execution", "resume")),
            description="Accept: the call is approved and the execution claimed to go on.",
        ),
        JointStep(
            name="resume_decline",
            steps=(("tool_call", "decline"), ("execution", "resume")),
            description="Decline or cancel: the call will raise inside the code, which goes on.",
        ),
        JointStep(
            name="asked",
            steps=(("tool_call", "ask"), ("execution", "pause")),
            description="The tool asked its user for values: its questions commit with the "
            "execution's pause (the call's intent committed before it ran).",
        ),
        JointStep(
            name="resume_answered",
            steps=(("tool_call", "answer"), ("execution", "resume")),
            description="The last open question is answered: the call is approved to be sent "
            "again, with the answers, and the execution claimed to go on.",
        ),
        JointStep(
            name="expire",
            steps=(("tool_call", "expire"), ("execution", "expire")),
            description="The deadline passed: both records expire together.",
        ),
        JointStep(
            name="cancel_with_call",
            steps=(("tool_call", "withdraw"), ("execution", "cancel")),
            description="Cancelling an execution withdraws its unsent call.",
        ),
    ),
    requires=(
        # The call is worked on only while its execution runs.
        (("tool_call", "auto_approve"), (E.RUNNING,)),
        (("tool_call", "block"), (E.RUNNING,)),
        (("tool_call", "dispatch"), (E.RUNNING,)),
        (("tool_call", "succeed"), (E.RUNNING,)),
        (("tool_call", "fail"), (E.RUNNING,)),
        (("tool_call", "succeed_at_least_once"), (E.RUNNING,)),
        (("tool_call", "fail_at_least_once"), (E.RUNNING,)),
        (("tool_call", "redispatch"), (E.RUNNING,)),
        # The execution finishes, or is cancelled alone, only once its call is settled.
        (("execution", "complete"), _CALL_SETTLED),
        (("execution", "fail"), _CALL_SETTLED),
        (("execution", "cancel"), _CALL_SETTLED),
        (("execution", "checkpoint"), (*_CALL_SETTLED, C.REQUESTED, C.APPROVED)),
        # A draining owner hands its execution back only with nothing in flight: a dispatched
        # call is waited for (or, past the drain's bound, left to recovery to judge).
        (("execution", "hand_back"), (*_CALL_SETTLED, C.REQUESTED, C.APPROVED)),
    ),
    # What the owner of the running execution does to its call commits only while the
    # execution is at the version the owner read: recovery (requeue, interrupt) and a hand
    # back change it, so a stalled owner that wakes up after its work was taken over is
    # refused.
    fenced=(
        ("tool_call", "auto_approve"),
        ("tool_call", "block"),
        ("tool_call", "dispatch"),
        ("tool_call", "redispatch"),
        ("tool_call", "succeed"),
        ("tool_call", "fail"),
        ("tool_call", "succeed_at_least_once"),
        ("tool_call", "fail_at_least_once"),
    ),
    # A call that may be made again has no commit of its own: its journal entry rides with
    # its execution's next durable step (a call that must not run twice, a pause, the end),
    # and that step's version check fences it.
    carried=(
        ("tool_call", "succeed_at_least_once"),
        ("tool_call", "fail_at_least_once"),
    ),
    # Recovery decides an orphaned execution's edge on its latest call as it read it: the
    # commit is fenced on that call, so a stalled owner that dispatches it between the read
    # and the commit (the execution has not moved yet) makes recovery decide again.
    recovery_fenced=(
        ("execution", "requeue"),
        ("execution", "interrupt"),
    ),
)

__all__ = ["EXECUTION_WITH_TOOL_CALL"]
