"""The formal lifecycles of Lockgate: the single source of truth for every status.

`MACHINES` holds the eight lifecycle declarations; `load()` returns them after every static
rule in `spec.checks` has passed (and, given the machine layer's bindings, after checking
that every guard and effect name is implemented).
"""

from __future__ import annotations

from collections.abc import Mapping

from lockgate.spec.approver_session import APPROVER_SESSION, ApproverSessionStatus
from lockgate.spec.checks import Bindings, Rule, SpecInvalid, SpecViolation, check
from lockgate.spec.composition import EXECUTION_WITH_TOOL_CALL
from lockgate.spec.crash_points import CrashPoint, crash_points, creation_points, every_crash_point
from lockgate.spec.enrolment import ENROLMENT, EnrolmentStatus
from lockgate.spec.execution import EXECUTION, ExecutionStatus
from lockgate.spec.instance import INSTANCE, InstanceStatus
from lockgate.spec.model import Composition, MachineSpec, StateSpec, TransitionKind, TransitionSpec
from lockgate.spec.owed_request import OWED_REQUEST, OwedRequestStatus
from lockgate.spec.session import SESSION, SessionStatus
from lockgate.spec.tool_call import TOOL_CALL, ToolCallStatus
from lockgate.spec.webhook_delivery import WEBHOOK_DELIVERY, WebhookDeliveryStatus

MACHINES: Mapping[str, MachineSpec] = {
    m.name: m
    for m in (
        EXECUTION,
        TOOL_CALL,
        SESSION,
        OWED_REQUEST,
        INSTANCE,
        WEBHOOK_DELIVERY,
        APPROVER_SESSION,
        ENROLMENT,
    )
}
COMPOSITIONS: Mapping[str, Composition] = {EXECUTION_WITH_TOOL_CALL.name: EXECUTION_WITH_TOOL_CALL}


def load(
    machines: Mapping[str, MachineSpec] | None = None,
    bindings: Mapping[str, Bindings] | None = None,
) -> Mapping[str, MachineSpec]:
    """The machines, validated; raises `SpecInvalid` listing every broken rule."""
    chosen = MACHINES if machines is None else machines
    violations: list[SpecViolation] = []
    for name, spec in chosen.items():
        violations.extend(check(spec, None if bindings is None else bindings.get(name)))
    if violations:
        raise SpecInvalid(violations)
    return chosen


__all__ = [
    "APPROVER_SESSION",
    "COMPOSITIONS",
    "ENROLMENT",
    "EXECUTION",
    "INSTANCE",
    "MACHINES",
    "OWED_REQUEST",
    "SESSION",
    "TOOL_CALL",
    "WEBHOOK_DELIVERY",
    "ApproverSessionStatus",
    "Bindings",
    "Composition",
    "CrashPoint",
    "EnrolmentStatus",
    "ExecutionStatus",
    "InstanceStatus",
    "MachineSpec",
    "OwedRequestStatus",
    "Rule",
    "SessionStatus",
    "SpecInvalid",
    "SpecViolation",
    "StateSpec",
    "ToolCallStatus",
    "TransitionKind",
    "TransitionSpec",
    "WebhookDeliveryStatus",
    "check",
    "crash_points",
    "creation_points",
    "every_crash_point",
    "load",
]
