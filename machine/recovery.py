"""Recovering the live work of dead instances, by the spec's recovery edges.

Which edge a record takes is the spec's: each state's `on_crash` lists its recovery events in
order, and the first whose guards hold (decided by the write path, on the facts gathered
here) is taken. For each execution left running by an owner that no longer holds a lease,
the journal is recovered before the execution (the model checker explores the same order):

1. its latest call, if dispatched, is re-dispatchable only when the tool is idempotent and
   the operator allows retries; otherwise it is marked in_doubt;
2. the execution is requeued (to go on from its last checkpoint) unless a call is in doubt
   or the operator chose conservative recovery, in which case it ends interrupted with a
   record of what ran;
3. an unsent call of an execution that ended is withdrawn.

Every step is a conditional write, so two instances recovering at once never both move the
same record: the loser's write conflicts and it moves on. Running recovery twice is harmless.
Only non-terminal executions are read (the live index), so the cost grows with live work.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from pydantic import JsonValue

from lockgate.machine.db.schema import Execution, ToolCall
from lockgate.machine.db.store import SqlStore
from lockgate.machine.engine import record_of
from lockgate.machine.errors import Conflict, GuardRefused
from lockgate.machine.instances import InstanceLease
from lockgate.machine.records import Record
from lockgate.machine.write_path import Step, WritePath
from lockgate.spec import ExecutionStatus as E
from lockgate.spec import ToolCallStatus as C

log = logging.getLogger("lockgate.recovery")


@dataclass
class RecoveryReport:
    declared_dead: list[str] = field(default_factory=list)
    requeued: list[str] = field(default_factory=list)
    interrupted: list[str] = field(default_factory=list)


def what_ran(calls: list[ToolCall], cause: str | None = None) -> JsonValue:
    """The record an interrupted execution keeps: every call made and the calls in doubt,
    and what cut it off (`cause`) when it was not a crash: a call's lost answer."""
    return {
        "calls": [
            {"seq": c.seq, "tool": c.tool, "status": c.status}
            for c in sorted(calls, key=lambda c: c.seq)
        ],
        "in_doubt": [{"seq": c.seq, "tool": c.tool} for c in calls if c.status == C.IN_DOUBT],
        **({"cause": cause} if cause is not None else {}),
    }


class Recovery:
    def __init__(
        self,
        *,
        store: SqlStore,
        write: WritePath,
        lease: InstanceLease,
        clock: Callable[[], datetime],
    ) -> None:
        self.store, self.write, self.lease, self.clock = store, write, lease, clock

    def orphaned(self, now: datetime | None = None) -> list[Execution]:
        """Running executions whose owner holds no lease (read through the live index)."""
        live = self.lease.live_ids(now)
        return [r for r in self.store.executions.running() if r.owner not in live]

    def run(self) -> RecoveryReport:
        # One instant for both reads: an instance whose lease lapsed is declared dead in the
        # same round in which its work is taken over.
        now = self.clock()
        report = RecoveryReport(declared_dead=self.lease.declare_dead_instances(now))
        for row in self.orphaned(now):
            try:
                outcome = self.recover_execution(row)
            except (Conflict, GuardRefused):
                continue  # another instance recovered it first
            if outcome == E.PENDING:
                report.requeued.append(row.id)
            elif outcome == E.INTERRUPTED:
                report.interrupted.append(row.id)
        if report.requeued or report.interrupted:
            log.info(
                "recovered executions: requeued=%s interrupted=%s",
                report.requeued,
                report.interrupted,
            )
        return report

    def recovery_step(
        self, record: Record, given: Mapping[str, object], now: datetime
    ) -> tuple[Step, str] | None:
        """The first of its state's `on_crash` events whose guards hold, with where it
        leads; None when none does (the state's `otherwise` holds: it is reclaimed by the
        requeued execution, or it waits durably). The spec decides, not this module."""
        state = self.write.machines[record.machine].spec.state(record.status)
        if state.on_crash is None:
            return None
        for event in state.on_crash.events:
            step = Step(record, event, given)
            try:
                transition, _ = self.write.decide(step, now)
            except GuardRefused:
                continue  # its guards do not hold here: the next event, in the spec's order
            return step, transition.dest
        return None

    def recover_execution(self, row: Execution, cause: str | None = None) -> E:
        """Move one orphaned execution by its state's recovery edge (requeue or interrupt),
        after its latest call's own (a dispatched call is marked in doubt unless it may be
        retried), and withdraw an unsent call of an execution that ended. `cause`: what cut
        it off, for its record, when its live owner gives it up (a call's lost answer).

        Every change to its calls is made in the same transaction as the change to the
        execution itself, so the execution's version guards them: if another instance
        recovered (and resumed) it since we read it, the whole step conflicts and nothing of
        a live instance's work is touched."""
        now = self.clock()
        calls = self.store.executions.calls(row.id)
        latest = calls[-1] if calls else None
        steps: list[Step] = []
        if latest is not None and latest.status == C.DISPATCHED:
            moved = self.recovery_step(record_of(latest), {}, now)
            if moved is not None:
                steps.append(moved[0])
                latest.status = moved[1]  # what_ran names it as it will be stored
        in_doubt = any(c.status == C.IN_DOUBT for c in calls)
        given = {"unsafe_in_doubt": in_doubt, "what_ran": what_ran(calls, cause)}
        decided = self.recovery_step(record_of(row), given, now)
        if decided is None:  # the spec gives a running execution an edge for every case
            raise RuntimeError(f"no recovery edge holds for execution {row.id}")
        step, dest = decided
        steps.append(step)
        if latest is not None and self._ends(dest):
            withdrawn = self.recovery_step(record_of(latest), {"execution_ended": True}, now)
            if withdrawn is not None:
                steps.append(withdrawn[0])
        # Decided on the calls as read above: if the latest one moved since (its stalled
        # owner woke and dispatched it before this commit), the decision is stale. A step
        # that moves the call checks its version itself; otherwise fence on it, so the
        # commit conflicts and the next round decides again on what is really stored.
        moved_call = latest is not None and any(s.record.id == latest.id for s in steps)
        fence = record_of(latest) if latest is not None and not moved_call else None
        self.write.apply(*steps, fence=fence)
        return E(dest)

    def _ends(self, status: str) -> bool:
        return self.write.machines["execution"].spec.state(status).terminal
