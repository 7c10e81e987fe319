"""The invariants every simulated run must hold, checked on what was persisted.

Each check reads only durable state (the database, the tools' effect log) and what was
logged, never the memory of a process: after a crash, that is all there is.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from pydantic import JsonValue

from lockgate.machine.db.audit_queries import AuditQueries, Engine
from lockgate.machine.db.schema import (
    Execution,
    OwedRequest,
    ToolCall,
    TransitionLog,
)
from lockgate.machine.db.schema import Session as SessionRow
from lockgate.simulation.inbox import Inbox
from lockgate.spec import (
    COMPOSITIONS,
    MACHINES,
    ExecutionStatus,
    OwedRequestStatus,
    SessionStatus,
    ToolCallStatus,
)
from lockgate.spec.composition import EXECUTION_WITH_TOOL_CALL
from lockgate.spec.session_lease import LeasePolicy
from lockgate.spec.traces import LoggedStep, check_trace

#: The calls made at once, journaled with their execution's next durable step (the spec's
#: `Composition.carried`): made again after a crash before it, as the spec allows.
MADE_AT_ONCE = frozenset(event for _, event in EXECUTION_WITH_TOOL_CALL.carried)

INVARIANTS = (
    "no execution is non-terminal without a live owner or a durable wait",
    "no call is left in flight by a finished execution",
    "terminal records never change",
    "an approval is consumed at most once",
    "no non-idempotent effect is dispatched twice",
    "every in_doubt call is named in the execution's record",
    "every persisted step is one the model allows, fences included",
    "the canary secret appears nowhere",
    "every owed id ends answered or reported exactly once",
    "no session outlives its lease",
    "no execution fails with an internal error",
    "a call is made again only where the spec allows it",
    "no call is made that the same run without a crash does not make",
    "each lost request's -32010 reaches the client, once; no answered request is reported",
)

#: The calls each execution made, by its code: `[(tool, arguments), ...]` in call order, and
#: whether the code ran to its own end.
CallLists = dict[str, list[tuple[list[tuple[str, str]], bool]]]


@dataclass(frozen=True)
class Violation:
    invariant: str
    detail: str
    records: tuple[str, ...] = ()


def _terminal(machine: str) -> frozenset[str]:
    return MACHINES[machine].terminal_names


def check_all(
    engine: Engine,
    effects: Iterable[dict[str, JsonValue]],
    logs: Iterable[str],
    canary: str,
    *,
    quiescent: bool = True,
    now: datetime | None = None,
    lease: LeasePolicy | None = None,
    reports_may_wait: bool = False,
    baseline: CallLists | None = None,
    inbox: Inbox | None = None,
) -> list[Violation]:
    """Every invariant, over every row of the database (not only what a client knew of).
    `quiescent`: no work is in flight any more (the simulator ran everything to the end),
    so a running execution is stranded even under a live owner. `baseline`: the calls the
    same scenario made without a crash (`calls_made`), for checkpoint fidelity. `inbox`:
    what the scenario's client received on its sessions."""
    found: list[Violation] = []
    audit = AuditQueries(engine)
    executions, calls, log = audit.executions(), audit.tool_calls(), audit.transitions()
    live = audit.live_instance_ids()
    found += _stranded(executions, calls, set() if quiescent else live)
    found += _terminal_unchanged(log)
    found += _approvals_once(log)
    found += _effects_once(calls, list(effects))
    found += _in_doubt_named(executions, calls)
    found += _edges_declared(log, calls)
    found += _canary(audit, list(logs), canary)
    found += _no_internal_failures(executions)
    found += _dispatched_as_allowed(calls, log, list(effects))
    if baseline is not None:
        found += _no_extra_calls(executions, calls, baseline)
    owed, sessions = audit.owed_requests(), audit.sessions()
    live_sessions = {
        r.id for r in sessions if r.status in (SessionStatus.ACTIVE, SessionStatus.IDLE)
    }
    found += _owed_settled(owed, log, quiescent, live_sessions if reports_may_wait else set())
    if inbox is not None:
        found += client_received(owed, inbox)
    if now is not None and lease is not None:
        found += _leases(sessions, now, lease)
    return found


def _owed_settled(
    owed: list[OwedRequest], log: list[TransitionLog], quiescent: bool, waiting: set[str]
) -> list[Violation]:
    """`waiting`: live sessions whose lost reports may still wait for the client's GET (a
    durable wait in the spec) because time was not let pass beyond their leases."""
    out = []
    unsettled = (OwedRequestStatus.OWED, OwedRequestStatus.LOST) if quiescent else ()
    for row in owed:
        if row.status == OwedRequestStatus.LOST and row.session_id in waiting:
            continue
        if row.status in unsettled:
            out.append(
                Violation(
                    INVARIANTS[8], f"request {row.request_id!r} is still {row.status}", (row.id,)
                )
            )
    settling = Counter(
        r.record_id for r in log if r.machine == "owed_request" and r.event in ("answer", "report")
    )
    out += [
        Violation(INVARIANTS[8], f"owed request {rid} was settled {n} times", (rid,))
        for rid, n in settling.items()
        if n > 1
    ]
    return out


def _no_internal_failures(executions: list[Execution]) -> list[Violation]:
    """The engine's last line of defence caught something: a bug, whatever the client saw."""
    out = []
    for e in executions:
        error = e.outcome.get("error") if isinstance(e.outcome, dict) else None
        if isinstance(error, dict) and error.get("code") == "internal_error":
            out.append(Violation(INVARIANTS[10], f"execution {e.id} failed internally", (e.id,)))
    return out


def _dispatched_as_allowed(
    calls: list[ToolCall], log: list[TransitionLog], effects: list[dict[str, JsonValue]]
) -> list[Violation]:
    """Checkpoint fidelity, from the tools' own log of what they did: a call journaled
    intent first is sent once when it is dispatched, and once more each time recovery
    re-dispatches it (only an idempotent call that was in flight at a crash). Any other
    repeat is a replay that went behind the last durable checkpoint; a dispatch with no
    journaled call is a call the engine made without recording it.

    A read made at once (`succeed_at_least_once`, `fail_at_least_once`) is the exception the
    spec declares: its journal entry rides with the next durable commit, so a crash before
    that commit makes it again, and one whose execution never got back to it (cancelled,
    or ended otherwise after the crash) has no journal row at all. Only reads may be so."""
    allowed = Counter(
        r.record_id
        for r in log
        if r.machine == "tool_call" and r.event in ("dispatch", "redispatch")
    )
    at_least_once = {
        r.record_id for r in log if r.machine == "tool_call" and r.event in MADE_AT_ONCE
    }
    made = Counter(str(e["idempotency_key"]) for e in effects)
    reads = {str(e["idempotency_key"]) for e in effects if e.get("read")}
    known = {c.id: c for c in calls}
    out = []
    for key, n in sorted(made.items()):
        call = known.get(key)
        if call is None:
            if key not in reads:
                out.append(
                    Violation(INVARIANTS[11], f"a tool ran for {key}, which no call records")
                )
        elif key in at_least_once:
            if not call.idempotent:
                out.append(
                    Violation(
                        INVARIANTS[11],
                        f"call {key} ({call.tool}) is not idempotent but was made with no "
                        "intent written first",
                        (call.execution_id, call.id),
                    )
                )
        elif n > allowed[key]:
            out.append(
                Violation(
                    INVARIANTS[11],
                    f"call {key} ({call.tool}, {call.status}) ran {n} times but was dispatched "
                    f"{allowed[key]} times",
                    (call.execution_id, call.id),
                )
            )
    return out


def calls_made(engine: Engine) -> CallLists:
    """Per execution code, the call lists of its executions (the baseline of a scenario)."""
    audit = AuditQueries(engine)
    return _call_lists(audit.executions(), audit.tool_calls())[0]


#: Statuses in which an execution's code ran to its own end: its calls are all it makes.
_RAN_TO_END = (ExecutionStatus.COMPLETED, ExecutionStatus.FAILED)


def _call_lists(
    executions: list[Execution], calls: list[ToolCall]
) -> tuple[CallLists, dict[str, list[ToolCall]]]:
    by_execution: dict[str, list[ToolCall]] = {}
    for c in sorted(calls, key=lambda c: (c.execution_id, c.seq)):
        by_execution.setdefault(c.execution_id, []).append(c)
    lists: CallLists = {}
    for e in executions:
        made = [(c.tool, repr(c.arguments)) for c in by_execution.get(e.id, [])]
        lists.setdefault(e.code, []).append((made, e.status in _RAN_TO_END))
    return lists, by_execution


def _agrees(made: list[tuple[str, str]], run: list[tuple[str, str]], ran_to_end: bool) -> bool:
    """A crash may end an execution early (its calls a prefix of the crash-free run's); a
    crash-free run cut short (interrupted, paused, cancelled) says nothing past its end."""
    if made == run[: len(made)]:
        return True
    return not ran_to_end and run == made[: len(run)]


def _no_extra_calls(
    executions: list[Execution], calls: list[ToolCall], baseline: CallLists
) -> list[Violation]:
    """Each execution's calls must agree with those an execution of the same code made in
    the run without a crash. A call beyond that is one that only the crash caused: named,
    with its execution."""
    _, by_execution = _call_lists(executions, calls)
    out = []
    for e in executions:
        expected = baseline.get(e.code)
        if not expected:
            continue  # code the crash-free run never started (a client's retry differs)
        made = by_execution.get(e.id, [])
        pairs = [(c.tool, repr(c.arguments)) for c in made]
        if any(_agrees(pairs, run, ended) for run, ended in expected):
            continue
        longest = max((sum(1 for _ in _common(pairs, run)) for run, _ in expected), default=0)
        extra = made[min(longest, len(made) - 1)]
        out.append(
            Violation(
                INVARIANTS[12],
                f"execution {e.id} made call {extra.seq} ({extra.tool} {extra.arguments!r}), "
                f"which the run without a crash does not make",
                (e.id, extra.id),
            )
        )
    return out


def _common(a: list[tuple[str, str]], b: list[tuple[str, str]]) -> Iterable[None]:
    for x, y in zip(a, b, strict=False):
        if x != y:
            return
        yield None


def client_received(owed: list[OwedRequest], inbox: Inbox) -> list[Violation]:
    """The ledger's rows against what the client received (see `simulation.inbox`)."""
    out = []
    for row in owed:
        request_id = str(row.request_id)
        if request_id not in inbox.resolved:
            continue  # a request some other client sent
        said = f"request {request_id!r} ({row.status})"
        if row.status == OwedRequestStatus.REPORTED and inbox.reports[request_id] == 0:
            out.append(Violation(INVARIANTS[13], f"{said} was settled unseen", (row.id,)))
        if row.status == OwedRequestStatus.ANSWERED and inbox.reports[request_id]:
            out.append(Violation(INVARIANTS[13], f"{said} was answered and reported", (row.id,)))
        if row.status in (OwedRequestStatus.REPORTED, OwedRequestStatus.ANSWERED) and (
            inbox.resolved[request_id] is None
        ):
            out.append(Violation(INVARIANTS[13], f"{said} never reached the client", (row.id,)))
    out += [
        Violation(INVARIANTS[13], f"report {owed_id} was written again after it was acknowledged")
        for owed_id in inbox.rewritten
    ]
    return out


def _leases(sessions: list[SessionRow], now: datetime, lease: LeasePolicy) -> list[Violation]:
    live = (SessionStatus.ACTIVE, SessionStatus.IDLE)
    return [
        Violation(INVARIANTS[9], f"session {row.id} is {row.status} past its cap", (row.id,))
        for row in sessions
        if row.status in live and now >= row.last_activity + lease.cap
    ]


def _stranded(
    executions: list[Execution], calls: list[ToolCall], live: set[str]
) -> list[Violation]:
    out = []
    by_id = {e.id: e for e in executions}
    for e in executions:
        if e.status == ExecutionStatus.RUNNING and e.owner not in live:
            out.append(
                Violation(
                    INVARIANTS[0], f"execution {e.id} is running with no one running it", (e.id,)
                )
            )
    in_flight = (ToolCallStatus.REQUESTED, ToolCallStatus.APPROVED, ToolCallStatus.DISPATCHED)
    for c in calls:
        parent = by_id.get(c.execution_id)
        if parent is not None and parent.status in _terminal("execution") and c.status in in_flight:
            out.append(
                Violation(
                    INVARIANTS[1],
                    f"call {c.id} is {c.status} but its execution is {parent.status}",
                    (c.execution_id, c.id),
                )
            )
    return out


def _terminal_unchanged(log: list[TransitionLog]) -> list[Violation]:
    return [
        Violation(
            INVARIANTS[2],
            f"{row.machine} {row.record_id} left terminal {row.source!r} by {row.event!r}",
            (row.record_id,),
        )
        for row in log
        if row.source in _terminal(row.machine)
    ]


def _approvals_once(log: list[TransitionLog]) -> list[Violation]:
    consuming = {
        (name, t.event)
        for name, spec in MACHINES.items()
        for t in spec.transitions
        if t.consumes_approval
    }
    counts = Counter(row.record_id for row in log if (row.machine, row.event) in consuming)
    return [
        Violation(INVARIANTS[3], f"call {rid} consumed {n} decisions", (rid,))
        for rid, n in counts.items()
        if n > 1
    ]


def _effects_once(calls: list[ToolCall], effects: list[dict[str, JsonValue]]) -> list[Violation]:
    counts = Counter(str(e["idempotency_key"]) for e in effects if not e.get("read"))
    return [
        Violation(INVARIANTS[4], f"the effect of call {key} happened {n} times", (key,))
        for key, n in counts.items()
        if n > 1
    ]


def _in_doubt_named(executions: list[Execution], calls: list[ToolCall]) -> list[Violation]:
    by_id = {e.id: e for e in executions}
    out = []
    for c in calls:
        if c.status != ToolCallStatus.IN_DOUBT:
            continue
        record = by_id[c.execution_id].what_ran
        named = record.get("in_doubt", []) if isinstance(record, dict) else []
        seqs = {item.get("seq") for item in named if isinstance(item, dict)}  # type: ignore[union-attr]
        if c.seq not in seqs:
            out.append(
                Violation(
                    INVARIANTS[5],
                    f"call {c.id} is in doubt but execution {c.execution_id} does not say so",
                    (c.execution_id, c.id),
                )
            )
    return out


def _edges_declared(log: list[TransitionLog], calls: list[ToolCall]) -> list[Violation]:
    """The persisted trace replayed through the model (`spec.traces.check_trace`)."""
    return [Violation(INVARIANTS[6], problem) for problem in _trace_problems(log, calls)]


def _trace_problems(log: list[TransitionLog], calls: list[ToolCall]) -> list[str]:
    steps = [
        LoggedStep(
            id=row.id or 0,
            machine=row.machine,
            record_id=row.record_id,
            event=row.event,
            source=row.source,
            dest=row.dest,
            version=row.version,
            txn=row.txn,
            fence=row.fence,
        )
        for row in log
    ]
    parents = {c.id: c.execution_id for c in calls}
    return check_trace(steps, parents, MACHINES, COMPOSITIONS)


def trace_problems(engine: Engine) -> list[str]:
    """Where a database's transition log disagrees with the model (for the test suite)."""
    audit = AuditQueries(engine)
    return _trace_problems(audit.transitions(), audit.tool_calls())


def _canary(audit: AuditQueries, logs: list[str], canary: str) -> list[Violation]:
    out = []
    for table, text in audit.stored_text():
        if canary in text:
            out.append(Violation(INVARIANTS[7], f"in table {table}"))
    if any(canary in line for line in logs):
        out.append(Violation(INVARIANTS[7], "in the logs"))
    return out


def history(engine: Engine, record_ids: Iterable[str]) -> list[str]:
    """The persisted transitions of some records, oldest first: a violation's trace."""
    wanted = set(record_ids)
    return [
        f"{row.machine} {row.record_id}: {row.event} {row.source}->{row.dest}"
        for row in AuditQueries(engine).transitions()
        if not wanted or any(row.record_id.startswith(w) for w in wanted)
    ]
