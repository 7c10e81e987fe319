"""The tool call lifecycle: the journal entry for one external call an execution makes."""

from __future__ import annotations

from enum import StrEnum

from lockgate.spec.model import (
    EffectTiming,
    ExternalEffect,
    MachineSpec,
    Otherwise,
    StateSpec,
    TransitionKind,
    TransitionSpec,
    durable_wait,
    recover_by,
)


class ToolCallStatus(StrEnum):
    REQUESTED = "requested"
    AWAITING_APPROVAL = "awaiting_approval"
    AWAITING_INPUT = "awaiting_input"
    APPROVED = "approved"
    DECLINED = "declined"
    BLOCKED = "blocked"
    EXPIRED = "expired"
    WITHDRAWN = "withdrawn"
    DISPATCHED = "dispatched"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    IN_DOUBT = "in_doubt"


S = ToolCallStatus

CALL_TOOL = ExternalEffect(
    name="call_tool",
    timing=EffectTiming.AFTER_COMMIT,
    description="Invoke the tool with secrets resolved at this moment. The intent (dispatched) "
    "is committed first, so a crash after it leaves the call visibly in doubt.",
)

CALL_TOOL_AT_LEAST_ONCE = ExternalEffect(
    name="call_tool_at_least_once",
    timing=EffectTiming.BEFORE_COMMIT,
    description="Invoke a tool that may be called again (idempotent, retries allowed) at once, "
    "with no intent written first. Its journal entry rides with the execution's next commit "
    "that must be durable (a call that must not run twice, a pause, the end); a crash before "
    "that commit loses the entry, and the requeued execution calls the tool again with the "
    "same idempotency key.",
)

TOOL_CALL = MachineSpec(
    name="tool_call",
    title="Tool call (the journal)",
    description=(
        "One external call made by an execution, keyed by (execution id, call sequence) which "
        "is also the idempotency key passed to the tool. A policy decides it; a person may "
        "have to approve it; intent is written before the effect and the result after."
    ),
    status=ToolCallStatus,
    created_alone=False,  # inserted with its execution's checkpoint, in that transaction
    states=(
        StateSpec(
            name=S.REQUESTED,
            description="The code called the tool; the policy has not decided yet. This "
            "version commits a call's row together with the policy's decision, so a row rests "
            "here only if an earlier version left it at a crash.",
            initial=True,
            owned=True,
            on_crash=recover_by(
                "withdraw_on_crash",
                otherwise=Otherwise.RECLAIM,
                why="If its execution ended in recovery the call is withdrawn; otherwise the "
                "execution is requeued and reaches this call again with the same sequence.",
            ),
        ),
        StateSpec(
            name=S.AWAITING_APPROVAL,
            description="Waiting for a person's decision; stored with the paused execution.",
            on_crash=durable_wait("The decision can arrive at any instance, at any time."),
        ),
        StateSpec(
            name=S.AWAITING_INPUT,
            description="The tool asked its user for values before it would go on (its "
            "questions, and the answers so far, are stored with the paused execution); once "
            "every question is answered it is sent again with the answers.",
            on_crash=durable_wait("The answers can arrive at any instance, at any time."),
        ),
        StateSpec(
            name=S.APPROVED,
            description="Allowed (by policy or a person); about to be dispatched.",
            owned=True,
            on_crash=recover_by(
                "withdraw_on_crash",
                otherwise=Otherwise.RECLAIM,
                why="Nothing was sent yet, so it is safe to dispatch it when the execution is "
                "requeued; if the execution ended instead, the call is withdrawn.",
            ),
        ),
        StateSpec(
            name=S.DISPATCHED,
            description="Intent recorded; the tool is being called.",
            owned=True,
            on_crash=recover_by(
                "mark_in_doubt",
                otherwise=Otherwise.RECLAIM,
                why="The effect may or may not have happened. A call that may be retried (an "
                "idempotent tool, and the operator allows it) is reclaimed: the requeued "
                "execution calls it again with the same idempotency key (redispatch). Any "
                "other call is in doubt and named on the execution.",
            ),
        ),
        StateSpec(name=S.SUCCEEDED, description="The tool returned a result.", terminal=True),
        StateSpec(
            name=S.FAILED,
            description="The tool raised; the error went back into the code.",
            terminal=True,
        ),
        StateSpec(
            name=S.DECLINED,
            description="A person declined (or cancelled); the call raised inside the code.",
            terminal=True,
        ),
        StateSpec(name=S.BLOCKED, description="The policy forbids this call.", terminal=True),
        StateSpec(
            name=S.EXPIRED,
            description="No decision arrived before the deadline.",
            terminal=True,
        ),
        StateSpec(
            name=S.WITHDRAWN,
            description="Its execution ended (cancelled or interrupted) before it was sent.",
            terminal=True,
        ),
        StateSpec(
            name=S.IN_DOUBT,
            description="Dispatched, then the process died before the result was stored, and "
            "the tool is not safe to call twice. Nobody knows whether it ran.",
            terminal=True,
        ),
    ),
    transitions=(
        TransitionSpec(
            event="auto_approve",
            source=(S.REQUESTED,),
            dest=S.APPROVED,
            effects=("record_grant_cover",),
            description="The policy approves the call without asking, or an earlier person's "
            "grant covers it (that decision recorded on it).",
        ),
        TransitionSpec(
            event="request_approval",
            source=(S.REQUESTED,),
            dest=S.AWAITING_APPROVAL,
            effects=("store_arguments_preview",),
            description="The policy requires a person; stored with the execution's pause.",
        ),
        TransitionSpec(
            event="block",
            source=(S.REQUESTED,),
            dest=S.BLOCKED,
            description="The policy blocks the call; it raises inside the code.",
        ),
        TransitionSpec(
            event="approve",
            source=(S.AWAITING_APPROVAL,),
            dest=S.APPROVED,
            unless=("deadline_passed",),
            effects=("record_decision",),
            consumes_approval=True,
            description="A person accepted in time.",
        ),
        TransitionSpec(
            event="decline",
            source=(S.AWAITING_APPROVAL,),
            dest=S.DECLINED,
            unless=("deadline_passed",),
            effects=("record_decision",),
            consumes_approval=True,
            description="A person declined or cancelled in time.",
        ),
        TransitionSpec(
            event="expire",
            source=(S.AWAITING_APPROVAL, S.AWAITING_INPUT),
            dest=S.EXPIRED,
            conditions=("deadline_passed",),
            description="The deadline passed with no decision (or its questions unanswered).",
        ),
        TransitionSpec(
            event="withdraw",
            source=(S.AWAITING_APPROVAL, S.AWAITING_INPUT),
            dest=S.WITHDRAWN,
            description="Its paused execution was cancelled before anyone decided or answered.",
        ),
        TransitionSpec(
            event="ask",
            source=(S.DISPATCHED,),
            dest=S.AWAITING_INPUT,
            effects=("store_questions",),
            effect_not_made=True,
            description="The tool asked its user for values instead of answering (it made no "
            "effect: a tool asks before it acts); its questions are stored with the "
            "execution's pause.",
        ),
        TransitionSpec(
            event="take_answers",
            source=(S.AWAITING_INPUT,),
            dest=S.AWAITING_INPUT,
            unless=("deadline_passed",),
            effects=("store_answers",),
            description="Answers to some of its questions arrived in time; it waits for the "
            "rest (a client may answer them one at a time).",
        ),
        TransitionSpec(
            event="answer",
            source=(S.AWAITING_INPUT,),
            dest=S.APPROVED,
            unless=("deadline_passed",),
            effects=("store_answers",),
            description="The last open question was answered in time: the call is sent again, "
            "with every answer, in the execution's resume.",
        ),
        TransitionSpec(
            event="dispatch",
            source=(S.APPROVED,),
            dest=S.DISPATCHED,
            external_effect=CALL_TOOL,
            description="Write the intent, then call the tool.",
        ),
        TransitionSpec(
            event="succeed",
            source=(S.DISPATCHED,),
            dest=S.SUCCEEDED,
            effects=("store_result",),
            description="Store the tool's result (size-limited, secrets redacted).",
        ),
        TransitionSpec(
            event="fail",
            source=(S.DISPATCHED,),
            dest=S.FAILED,
            effects=("store_result",),
            description="Store the tool's error.",
        ),
        TransitionSpec(
            event="succeed_at_least_once",
            source=(S.REQUESTED,),
            dest=S.SUCCEEDED,
            conditions=("retry_allowed",),
            effects=("store_result",),
            external_effect=CALL_TOOL_AT_LEAST_ONCE,
            description="A call the policy approves that may be called again: the tool is "
            "called first and the call is journaled, with its result, in the execution's next "
            "durable commit (no commit of its own).",
        ),
        TransitionSpec(
            event="fail_at_least_once",
            source=(S.REQUESTED,),
            dest=S.FAILED,
            conditions=("retry_allowed",),
            effects=("store_result",),
            external_effect=CALL_TOOL_AT_LEAST_ONCE,
            description="As succeed_at_least_once, when the tool raised: the error went back "
            "into the code and is journaled with the next durable commit.",
        ),
        TransitionSpec(
            event="withdraw_on_crash",
            source=(S.REQUESTED, S.APPROVED),
            dest=S.WITHDRAWN,
            kind=TransitionKind.RECOVERY,
            conditions=("execution_ended",),
            description="Recovery: the execution ended, so this unsent call never will be.",
        ),
        TransitionSpec(
            event="redispatch",
            source=(S.DISPATCHED,),
            dest=S.DISPATCHED,
            conditions=("retry_allowed",),
            external_effect=CALL_TOOL,
            description="After a crash, the requeued execution reaches a dispatched call that "
            "may be retried (idempotent tool, retries allowed) and calls it again with the "
            "same idempotency key.",
        ),
        TransitionSpec(
            event="mark_in_doubt",
            source=(S.DISPATCHED,),
            dest=S.IN_DOUBT,
            kind=TransitionKind.RECOVERY,
            unless=("retry_allowed",),
            description="Recovery: calling again could repeat the effect; the call is in doubt.",
        ),
    ),
)

__all__ = ["TOOL_CALL", "ToolCallStatus"]
