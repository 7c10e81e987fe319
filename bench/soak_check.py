"""The soak's checker: after the run, what the database, the clients' own logs and the notes
tool's effect log say, as figures, with the ones that must be zero checked.

It reads every row (`AuditQueries`: the verifier's whole-table reads), never through the
code it checks, and each figure names where it comes from.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.soak_clients import ClientLog
from lockgate.machine.db.audit_queries import AuditQueries
from lockgate.machine.db.connect import open_engine
from lockgate.machine.tools.notes import NotesSource
from lockgate.spec import ExecutionStatus as E

#: Figures that must be zero for the run to pass.
MUST_BE_ZERO = ("hung", "effects duplicated", "approvals consumed twice", "stranded", "secrets")


@dataclass(frozen=True)
class Figures:
    rows: dict[str, int]

    @property
    def failures(self) -> list[str]:
        return [name for name in MUST_BE_ZERO if self.rows.get(name, 0) != 0]

    def table(self) -> str:
        lines = ["| figure | value |", "|---|---|"]
        lines += [f"| {name} | {value} |" for name, value in self.rows.items()]
        return "\n".join(lines)


def check(
    database_url: str, notes_dir: Path, logs: Iterable[ClientLog], server_logs: Iterable[Path],
    secrets: Sequence[str], kills: int,
) -> Figures:  # fmt: skip
    """The figures; `secrets` are the values that must appear in no row, no server log and
    nothing a client saw (the key that seals input_required states, the tools' token, the
    approving person's session secret)."""
    clients = list(logs)
    requests: Counter[str] = Counter()
    operations: Counter[str] = Counter()
    for log in clients:
        requests.update(log.requests)
        operations.update(status for _, status in log.operations.values())

    engine = open_engine(database_url)
    try:
        audit = AuditQueries(engine)
        executions = audit.executions()
        transitions = audit.transitions()
        leaked_rows = sum(
            1 for _, text in audit.stored_text() if any(secret in text for secret in secrets)
        )
    finally:
        engine.dispose()
    per_call: dict[str, Counter[str]] = {}
    for t in transitions:
        if t.machine == "tool_call":
            per_call.setdefault(t.record_id, Counter())[t.event] += 1
    approved = [c for c in per_call.values() if c["approve"]]
    writes = Counter(
        e["key"] for e in NotesSource(notes_dir).effects() if e.get("tool") == "notes.write"
    )
    texts = [p.read_text() for p in server_logs if p.exists()]
    texts += [line for log in clients for line in log.lines]
    leaked_logs = sum(1 for text in texts if any(secret in text for secret in secrets))
    statuses = Counter(e.status for e in executions)
    return Figures(
        {
            "instances killed": kills,
            "requests sent": requests["sent"],
            "answered": requests["answered"],
            "reported (-32010)": requests["reported"],
            "failed (connection cut, instance down)": requests["failed"],
            "hung": requests["hung"],
            "operations": sum(operations.values()),
            "operations completed": operations[E.COMPLETED],
            "operations interrupted (reported with what ran)": operations[E.INTERRUPTED],
            "operations given up by the client": operations["given up"],
            "operations answered with an error (a limit, a refusal)": operations["error"],
            "operations ending otherwise": sum(operations.values())
            - sum(operations[k] for k in (E.COMPLETED, E.INTERRUPTED, "given up", "error")),
            "approvals granted": len(approved),
            "approvals consumed once": sum(
                1 for c in approved if c["dispatch"] + c["redispatch"] == 1
            ),
            "approvals consumed twice": sum(
                1 for c in approved if c["dispatch"] + c["redispatch"] > 1
            ),
            "writes made": sum(writes.values()),
            "effects duplicated": sum(1 for n in writes.values() if n > 1),
            "executions": len(executions),
            "waiting for a person": statuses[E.WAITING_FOR_INTERACTION],
            "stranded": statuses[E.PENDING] + statuses[E.RUNNING],
            "secrets": leaked_rows + leaked_logs,
        }
    )
