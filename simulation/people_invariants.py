"""The invariants of people who approve, on what was persisted."""

from __future__ import annotations

from collections import Counter
from datetime import datetime

from lockgate.machine.db.audit_queries import AuditQueries, Engine
from lockgate.simulation.invariants import Violation
from lockgate.spec import ApproverSessionStatus as A
from lockgate.spec import EnrolmentStatus as N

PEOPLE_INVARIANTS = (
    "every used enrolment link registered exactly one passkey, and every passkey came from one",
    "no session or link outlives its approver, or its lifetime once the run is over",
    "a decision made through a person's door names the person",
)
#: The doors only a signed-in person decides through.
PERSON_DOORS = frozenset({"approval_page", "inbox"})


def check_people(engine: Engine, now: datetime) -> list[Violation]:
    audit = AuditQueries(engine)
    found: list[Violation] = []
    approvers = {a.id for a in audit.approvers()}
    used = Counter(e.approver_id for e in audit.enrolments() if e.status == N.USED)
    passkeys = Counter(p.approver_id for p in audit.passkeys())
    for approver in sorted(set(used) | set(passkeys)):
        if approver in approvers and used[approver] != passkeys[approver]:
            found.append(
                Violation(
                    PEOPLE_INVARIANTS[0],
                    f"approver {approver}: {used[approver]} used link(s), "
                    f"{passkeys[approver]} passkey(s)",
                )
            )
    live = [
        *(
            (s.id, s.approver_id, s.expires_at)
            for s in audit.approver_sessions()
            if s.status == A.ACTIVE
        ),
        *((e.id, e.approver_id, e.expires_at) for e in audit.enrolments() if e.status == N.ISSUED),
    ]
    for row_id, approver, expires_at in live:
        if approver not in approvers:
            found.append(Violation(PEOPLE_INVARIANTS[1], f"{row_id} outlives its approver"))
        elif expires_at <= now:
            found.append(Violation(PEOPLE_INVARIANTS[1], f"{row_id} outlives its lifetime"))
    for call in audit.tool_calls():
        decision = call.decision if isinstance(call.decision, dict) else {}
        if decision.get("door") in PERSON_DOORS:
            person = decision.get("person")
            if not isinstance(person, dict) or not person.get("name"):
                found.append(
                    Violation(PEOPLE_INVARIANTS[2], f"call {call.id} decided by nobody named")
                )
    return found
