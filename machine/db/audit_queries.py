"""Whole-table reads, for the simulator's invariants and scenarios and for the tests: a
verifier reads every row (every execution, call, session and owed request, not only those
a client learned of), as an operator would, and never through the code it checks.

Nothing that serves clients reads through this class: these reads are unbounded by design,
and cheap only on the small databases of a simulated run.
"""

from __future__ import annotations

from collections.abc import Iterator

from sqlalchemy import Engine as Engine  # re-exported: the handle a verifier is given
from sqlmodel import col, select

from lockgate.machine.db.queries import Queries
from lockgate.machine.db.schema import (
    Approver,
    ApproverSession,
    Enrolment,
    Execution,
    Instance,
    OwedRequest,
    Passkey,
    Session,
    ToolCall,
    TransitionLog,
    WebhookDelivery,
    metadata,
)
from lockgate.spec import INSTANCE


class AuditQueries(Queries):
    def executions(self) -> list[Execution]:
        """Every execution, in any state (a stranded one is exactly what is looked for)."""
        with self._session() as s:
            return list(s.exec(select(Execution)))

    def tool_calls(self) -> list[ToolCall]:
        """Every call, each execution's in the order it made them."""
        with self._session() as s:
            return list(s.exec(select(ToolCall).order_by(col(ToolCall.seq))))

    def transitions(self) -> list[TransitionLog]:
        """The transition log, oldest first."""
        with self._session() as s:
            return list(s.exec(select(TransitionLog).order_by(col(TransitionLog.id))))

    def owed_requests(self) -> list[OwedRequest]:
        """Every owed-request entry, settled or not: each must end answered or reported."""
        with self._session() as s:
            return list(s.exec(select(OwedRequest)))

    def sessions(self) -> list[Session]:
        """Every session row, ended ones included (their leases are checked)."""
        with self._session() as s:
            return list(s.exec(select(Session)))

    def instances(self) -> list[Instance]:
        """Every incarnation of every instance (an operator's view of who ran)."""
        with self._session() as s:
            return list(s.exec(select(Instance)))

    def webhook_deliveries(self) -> list[WebhookDelivery]:
        """Every outbox row, in creation order."""
        with self._session() as s:
            return list(s.exec(select(WebhookDelivery).order_by(col(WebhookDelivery.created_at))))

    def approvers(self) -> list[Approver]:
        """Every approver (a session or a link of one removed must be over)."""
        with self._session() as s:
            return list(s.exec(select(Approver)))

    def passkeys(self) -> list[Passkey]:
        """Every registered passkey (each from one used enrolment link)."""
        with self._session() as s:
            return list(s.exec(select(Passkey)))

    def enrolments(self) -> list[Enrolment]:
        """Every enrolment link's row, used and ended ones included."""
        with self._session() as s:
            return list(s.exec(select(Enrolment)))

    def approver_sessions(self) -> list[ApproverSession]:
        """Every approver session's row, ended ones included."""
        with self._session() as s:
            return list(s.exec(select(ApproverSession)))

    def live_instance_ids(self) -> set[str]:
        """Instances live or draining: their lease still counts."""
        with self._session() as s:
            rows = s.exec(select(Instance.id).where(col(Instance.status).in_(INSTANCE.live_names)))
            return set(rows)

    def stored_text(self) -> Iterator[tuple[str, str]]:
        """(table name, text) for every column of every row of every table: what a scan for
        a secret that must never be stored reads. Bytes (sealed snapshots) are decoded
        loosely, as latin-1, so a secret inside them is found too."""
        with self.engine.connect() as conn:
            for table in metadata.sorted_tables:
                for row in conn.execute(table.select()):
                    for value in row:
                        if isinstance(value, bytes | memoryview):
                            yield table.name, bytes(value).decode("latin-1")
                        else:
                            yield table.name, repr(value)
